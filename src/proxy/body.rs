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

/// Read the whole body (`limit` bytes at most). With `pingora_replays` (a request may be
/// served by Pingora's proxy loop), Pingora's retry buffer is arranged so that it replays the
/// body on every attempt; without, no retry buffer is kept (it would copy the body once more
/// for nothing) and the body is marked [`Body::own_replay`].
pub async fn read_whole_body(
    session: &mut Session,
    framing: Framing,
    limit: usize,
    pingora_replays: bool,
) -> Result<Body, BodyError> {
    let (expected, from_start) = match framing {
        Framing::Length(n) if n > limit => return Err(BodyError::TooLarge),
        Framing::Length(n) => (Some(n), n <= RETRY_BUFFER),
        Framing::Chunked => (None, true),
    };
    // Pingora's retry buffer: from the first read, or from the read that leaves at most its
    // size (the tail technique, for a longer body of known length); never when nothing will
    // ask it to replay.
    let mut buffering = pingora_replays && from_start;
    let tail_of = expected.filter(|_| pingora_replays);
    if buffering {
        session.as_mut().enable_retry_buffering();
    }
    // The body read so far: over HTTP/1.1 its first chunk as Pingora made it (an exact copy
    // of its read: a body that comes in one read, most of them, is not copied again), the
    // rest gathered only when a second comes. An HTTP/2 chunk shares the connection's receive
    // buffer, so it is copied out at once, as every chunk was before.
    let mut body = Gathered {
        keep_first: !session.as_ref().is_http2(),
        ..Gathered::default()
    };
    // Bytes the retry buffer took since it was enabled (what `get_retry_buffer` would hold,
    // learned without the copy of it that call makes).
    let mut buffered = 0usize;
    loop {
        if let (false, Some(n)) = (buffering, tail_of) {
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
                if buffering {
                    buffered += chunk.len();
                }
                body.push(chunk, expected);
                // A body whose end is known (its length read, or HTTP/2's end of stream)
                // needs no further read to learn it: that read is a timeout's setup and a
                // call for a `None` (most bodies come in one read).
                if session.as_mut().is_body_done() {
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => return Err(BodyError::Read(e)),
        }
    }
    // A chunked body past the buffer (its tail could not be placed), or one that arrived in a
    // single read past it (no buffer at all): Pingora's retry buffer holds nothing to replay
    // (`get_retry_buffer` is `None`: never enabled, truncated, or empty).
    let no_retry_buffer = !buffering || buffered == 0 || session.retry_buffer_truncated();
    let bytes = body.into_bytes();
    let own_replay =
        !bytes.is_empty() && (bytes.len() > RETRY_BUFFER && expected.is_none() || no_retry_buffer);
    Ok(Body { bytes, own_replay })
}

/// A body's chunks as they are read: the first kept as it came, later ones appended to a
/// buffer sized for the whole body when its length is known.
#[derive(Default)]
struct Gathered {
    /// The first chunk may be kept as it came (else it is copied like the rest).
    keep_first: bool,
    first: Option<Bytes>,
    rest: Option<BytesMut>,
}

impl Gathered {
    fn len(&self) -> usize {
        match (&self.first, &self.rest) {
            (_, Some(all)) => all.len(),
            (Some(first), None) => first.len(),
            (None, None) => 0,
        }
    }

    fn push(&mut self, chunk: Bytes, expected: Option<usize>) {
        if let Some(all) = self.rest.as_mut() {
            all.put_slice(&chunk);
            return;
        }
        match self.first.take() {
            None if self.keep_first => self.first = Some(chunk),
            first => {
                let held = first.as_ref().map_or(0, Bytes::len);
                let size = expected.unwrap_or(4096).max(held + chunk.len());
                let mut all = BytesMut::with_capacity(size);
                if let Some(first) = first {
                    all.put_slice(&first);
                }
                all.put_slice(&chunk);
                self.rest = Some(all);
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match (self.first, self.rest) {
            (_, Some(all)) => all.freeze(),
            (Some(first), None) => first,
            (None, None) => Bytes::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gathers_to_its_chunks_in_order_and_one_chunk_is_not_copied() {
        let chunks: [&'static [u8]; 3] = [b"{\"model\":", b"\"m\",\"x\":", b"1}"];
        for keep_first in [true, false] {
            for n in 0..=chunks.len() {
                for expected in [None, Some(4), Some(64)] {
                    let mut body = Gathered {
                        keep_first,
                        ..Gathered::default()
                    };
                    let mut want = Vec::new();
                    for c in &chunks[..n] {
                        body.push(Bytes::from_static(c), expected);
                        want.extend_from_slice(c);
                        assert_eq!(body.len(), want.len());
                    }
                    assert_eq!(&body.into_bytes()[..], &want[..], "{keep_first} {n}");
                }
            }
        }
        // One chunk, kept: the very bytes Pingora handed over.
        let chunk = Bytes::from(b"{\"model\":\"m\"}".to_vec());
        let mut body = Gathered {
            keep_first: true,
            ..Gathered::default()
        };
        body.push(chunk.clone(), Some(chunk.len()));
        assert_eq!(body.into_bytes().as_ptr(), chunk.as_ptr());
        // Not kept (HTTP/2): copied out.
        let mut body = Gathered::default();
        body.push(chunk.clone(), Some(chunk.len()));
        assert_ne!(body.into_bytes().as_ptr(), chunk.as_ptr());
    }
}
