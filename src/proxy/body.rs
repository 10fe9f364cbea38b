//! Reading the whole request body in `request_filter` so that Pingora still forwards it, on
//! every attempt, whatever its size ("the tail technique").
//!
//! Stock Pingora forwards a body consumed in `request_filter` only through its 64 KiB retry
//! buffer, which it hands to `request_body_filter(Some(buf), eos = true)` at the start of
//! every attempt. Reads are capped at 64 KiB, so if buffering is switched on just before the
//! read after which at most 64 KiB remain, the buffer ends holding exactly the final,
//! non-empty tail: Pingora then calls the body filter once per attempt, and the gateway swaps
//! the tail for the whole rewritten body it holds.
//!
//! Guards: a `Content-Length` over the limit is refused before reading (413). A chunked body
//! is buffered from the first read; past 64 KiB its length was unknown until the end, so the
//! tail could not be placed, and a body that arrived in one read larger than 64 KiB (only
//! possible right behind very large headers) leaves no buffer at all: both are marked
//! [`Body::own_replay`] and go through the hold path (`super::hold`), which sends the body
//! itself on every attempt.

use bytes::{BufMut, Bytes, BytesMut};
use http::header;
use pingora_proxy::Session;

/// Pingora's retry buffer size (`BODY_BUF_LIMIT` in pingora-core).
pub const RETRY_BUFFER: usize = 64 * 1024;

#[derive(Debug)]
pub enum BodyError {
    TooLarge,
    Read(Box<pingora_error::Error>),
}

/// The request body as read.
#[derive(Debug)]
pub struct Body {
    pub bytes: Bytes,
    /// Pingora's retry buffer cannot replay it: only the hold path can forward it.
    pub own_replay: bool,
}

/// The request's declared framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    /// Length unknown until the end: HTTP/1.1 chunked, or HTTP/2 without `content-length`.
    Chunked,
}

pub fn framing(session: &Session) -> Framing {
    let req = session.req_header();
    let headers = &req.headers;
    // One pass over the (few) headers instead of two hashed lookups.
    let mut chunked = false;
    let mut declared = None;
    for (name, value) in headers {
        if *name == header::TRANSFER_ENCODING {
            chunked |= value.as_bytes().eq_ignore_ascii_case(b"chunked");
        } else if *name == header::CONTENT_LENGTH && declared.is_none() {
            declared = Some(value);
        }
    }
    // HTTP/2 has no chunked coding: a body without `content-length` runs to END_STREAM, its
    // length unknown (read as zero, the retry buffer would be enabled from the first read and
    // overflow past 64 KiB). Without a body this reads nothing either way.
    if chunked || (declared.is_none() && req.version == http::Version::HTTP_2) {
        return Framing::Chunked;
    }
    let len = declared
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    Framing::Length(len)
}

/// Read the whole body (`limit` bytes at most), arranging Pingora's retry buffer so that the
/// body is replayed on every attempt.
pub async fn read_whole_body(
    session: &mut Session,
    framing: Framing,
    limit: usize,
) -> Result<Body, BodyError> {
    let (expected, mut buffering) = match framing {
        Framing::Length(n) if n > limit => return Err(BodyError::TooLarge),
        Framing::Length(n) => (Some(n), n <= RETRY_BUFFER),
        Framing::Chunked => (None, true),
    };
    if buffering {
        session.as_mut().enable_retry_buffering();
    }
    let mut body = BytesMut::with_capacity(expected.unwrap_or(4096));
    loop {
        if let (false, Some(n)) = (buffering, expected) {
            if n.saturating_sub(body.len()) <= RETRY_BUFFER {
                session.as_mut().enable_retry_buffering();
                buffering = true;
            }
        }
        match session.as_mut().read_request_body().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > limit {
                    return Err(BodyError::TooLarge);
                }
                body.put_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return Err(BodyError::Read(e)),
        }
    }
    // A chunked body past the buffer (its tail could not be placed), or one that arrived in a
    // single read past it (no buffer at all).
    let own_replay = !body.is_empty()
        && (body.len() > RETRY_BUFFER && expected.is_none()
            || session.as_ref().get_retry_buffer().is_none());
    Ok(Body {
        bytes: body.freeze(),
        own_replay,
    })
}
