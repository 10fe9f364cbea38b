//! The driven path's upstream request on the wire: a request head and its body of known
//! length leave in one write (issue 22).
//!
//! Pingora's `write_request_header` does `write_all` + `flush` of the head and the body
//! follows in its own write: two sends, and on loopback each carries the receiver's TCP work.
//! Here, for an HTTP/1.1 session whose body length is known and small, the head is written
//! with the body in one vectored write on the session's stream, which then goes back into a
//! fresh session (`HttpSession::new_with_options`, as the connector builds it, made in its box:
//! [`session_for`]). The head's bytes are exactly those Pingora's own `http_req_header_to_wire`
//! writes for the request's header: `attempt::HeaderPlan::head` writes them straight from the
//! caller's fields and the gateway's, without building the header map (a property test holds
//! the two equal), and a request it declines is serialised by Pingora's function ([`head_of`]). The stream is
//! the connector's real TCP (or TLS) stream, so the pool, its fd-keyed reuse test and the
//! digests are untouched.
//!
//! What a fresh session lacks is the state `write_request_header` would have left: the request
//! it wrote (read only for `HEAD`, upgrades and a request's `Connection: close`), the body
//! writer (not used again: the body is whole) and the sent-bytes count (not read by
//! signalbox). Requests that would need any of it take Pingora's own two writes.
//!
//! The fast path (Pingora's proxy loop) keeps its two writes: its session is Pingora's
//! (`pingora-proxy` `proxy_h1.rs`: `client_session.write_request_header(..)`, then the body
//! through `send_body_to1` → `write_body`), and no hook sees it. The only seam under it is
//! `PeerOptions::custom_l4` returning a `VirtualSocketStream`, and a virtual stream's fd is
//! `-1` (`l4/stream.rs`: `RawStream::Virtual(_) => -1`): the pool's reuse test
//! (`connectors/mod.rs` `reused_stream`: `if peer.matches_fd(stream.id()) && ...`) runs
//! `getpeername(-1)`, which fails, so `check_fd_match` answers false and every pooled
//! connection is dropped; and every virtual stream is pooled under the same id `-1`. One send
//! saved would cost a TCP connect per request.

use std::io::{ErrorKind, IoSlice};

use bytes::Bytes;
use http::header;
use pingora_core::protocols::http::client::HttpSession as UpstreamSession;
use pingora_core::protocols::http::v1::client::{http_req_header_to_wire, HttpSession as H1};
use pingora_core::protocols::Stream;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, OrErr, Result};
use pingora_http::RequestHeader;
use tokio::io::AsyncWriteExt;

/// The largest body sent with its head in one write; a larger one goes as Pingora sends it.
pub const COALESCE_LIMIT: usize = 64 * 1024;

/// The head Pingora would write for `request` (an error for a target it refuses).
pub fn head_of(request: &RequestHeader) -> Result<bytes::BytesMut> {
    http_req_header_to_wire(request).ok_or_else(|| {
        Error::explain(
            ErrorType::InvalidHTTPHeader,
            "request-line contains forbidden delimiter bytes",
        )
    })
}

/// Pingora's request header for a head [`crate::proxy::attempt::HeaderPlan::head`] wrote,
/// for a session that writes its own (never the driven path's: its peers ask for HTTP/1.1
/// only; kept so that any other session gets the same request). A credential's field is
/// marked sensitive again, as the catalog made it (HTTP/2 must not index it).
pub fn header_of(head: &[u8]) -> Result<Box<RequestHeader>> {
    let bad = || Error::explain(ErrorType::InvalidHTTPHeader, "an unreadable request head");
    let mut fields = [httparse::EMPTY_HEADER; 256];
    let mut parsed = httparse::Request::new(&mut fields);
    if !matches!(parsed.parse(head), Ok(httparse::Status::Complete(_))) {
        return Err(bad());
    }
    let (Some(method), Some(path)) = (parsed.method, parsed.path) else {
        return Err(bad());
    };
    let mut request =
        RequestHeader::build_no_case(method, path.as_bytes(), Some(parsed.headers.len()))?;
    for field in parsed.headers.iter() {
        let name = http::HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| bad())?;
        let mut value = http::HeaderValue::from_bytes(field.value).map_err(|_| bad())?;
        let credential = crate::config::CREDENTIAL_HEADERS.contains(&name.as_str())
            || name.as_str() == "x-goog-api-key";
        value.set_sensitive(credential);
        request.append_header(name, value)?;
    }
    Ok(Box::new(request))
}

/// Whether `request` with `body` can leave in one write with nothing a fresh session would
/// miss: a Content-Length that is the body's, no chunking, no upgrade, not `HEAD`, and no
/// `Connection` header (whose `close` the session would have to remember).
pub fn coalescable(request: &RequestHeader, body: &[u8]) -> bool {
    let headers = &request.headers;
    if body.len() > COALESCE_LIMIT
        || request.method == http::Method::HEAD
        || request.version != http::Version::HTTP_11
        || headers.contains_key(header::TRANSFER_ENCODING)
        || headers.contains_key(header::UPGRADE)
        || headers.contains_key(header::CONNECTION)
    {
        return false;
    }
    let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
    match (lengths.next(), lengths.next()) {
        (None, None) => body.is_empty(),
        (Some(v), None) => {
            v.to_str().ok().and_then(|s| s.parse::<usize>().ok()) == Some(body.len())
        }
        _ => false,
    }
}

/// Write `head` (an HTTP/1.1 request head) and its whole `body` on `stream` (a connection's,
/// taken from its session) in one write, bounded per write by the peer's write timeout as
/// Pingora bounds it, and give the stream back for [`session_for`].
pub async fn send_whole(
    mut stream: Stream,
    peer: &HttpPeer,
    head: &[u8],
    body: &Bytes,
) -> Result<Stream> {
    let write = write_both(&mut stream, head, body);
    match peer.options.write_timeout {
        Some(t) => match super::bounded::within(t, write).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::from(ErrorKind::TimedOut)),
        },
        None => write.await,
    }
    .map_err(|e| match e.kind() {
        ErrorKind::TimedOut => Error::because(
            ErrorType::WriteTimedout,
            "while writing request (timeout)",
            e,
        ),
        _ => Error::because(ErrorType::WriteError, "while writing request", e),
    })?;
    stream
        .flush()
        .await
        .or_err(ErrorType::WriteError, "flushing request")?;
    Ok(stream)
}

/// The session to read the response from, on the stream [`send_whole`] wrote the request to:
/// made in its box (the session is ~470 bytes, and moves as a pointer from here), with no read
/// timeout of Pingora's (the caller bounds the header itself).
pub fn session_for(stream: Stream, peer: &HttpPeer) -> Box<UpstreamSession> {
    let mut session = Box::write(
        Box::new_uninit(),
        UpstreamSession::H1(H1::new_with_options(stream, peer)),
    );
    session.set_write_timeout(peer.options.write_timeout);
    session
}

/// `head` then `body`, one `writev` when the stream takes vectored writes (TCP does), else
/// one copied buffer; a short write continues where it stopped.
async fn write_both(stream: &mut Stream, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    if body.is_empty() {
        return stream.write_all(head).await;
    }
    if !stream.is_write_vectored() {
        // TLS: one record instead of two; the copy is the body's, at most COALESCE_LIMIT.
        let mut whole = Vec::with_capacity(head.len() + body.len());
        whole.extend_from_slice(head);
        whole.extend_from_slice(body);
        return stream.write_all(&whole).await;
    }
    let (mut head, mut body) = (head, body);
    while !head.is_empty() {
        let n = stream
            .write_vectored(&[IoSlice::new(head), IoSlice::new(body)])
            .await?;
        if n == 0 {
            return Err(ErrorKind::WriteZero.into());
        }
        let from_head = n.min(head.len());
        head = &head[from_head..];
        body = &body[n - from_head..];
    }
    stream.write_all(body).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_read_back_is_written_as_it_was() {
        let head = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\naccept: */*\r\nx-api-key: k\r\nHost: api.test\r\nContent-Length: 2\r\nx-request-id: r\r\n\r\n";
        let header = header_of(head).expect("a head");
        assert_eq!(&head_of(&header).expect("writable")[..], &head[..]);
        let key = header.headers.get("x-api-key").expect("the credential");
        assert!(
            key.is_sensitive(),
            "a credential read back is not indexed by HTTP/2"
        );
        let kind = header.headers.get(header::CONTENT_TYPE).expect("the type");
        assert!(!kind.is_sensitive());
        assert!(
            header_of(b"POST /v1 HTTP/1.1\r\nHost").is_err(),
            "an unended head"
        );
    }

    #[tokio::test]
    async fn a_head_and_its_body_arrive_whole_and_in_order_through_short_writes() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let reader = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut got = Vec::new();
            conn.read_to_end(&mut got).await.expect("read");
            got
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut stream: Stream = Box::new(pingora_core::protocols::l4::stream::Stream::from(tcp));
        // A body far past what one write takes on loopback: the writes come back short, in
        // the head's and the body's bytes.
        let head = b"POST /v1 HTTP/1.1\r\nContent-Length: 3000000\r\n\r\n";
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        write_both(&mut stream, head, &body).await.expect("write");
        stream.flush().await.expect("flush");
        drop(stream);
        let got = reader.await.expect("reader");
        let mut want = head.to_vec();
        want.extend_from_slice(&body);
        assert_eq!(got.len(), want.len());
        assert!(
            got == want,
            "the bytes on the wire are the head, then the body"
        );
    }

    fn post(len: Option<&str>) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).expect("build");
        if let Some(l) = len {
            r.insert_header(header::CONTENT_LENGTH, l).expect("header");
        }
        r
    }

    #[test]
    fn known_lengths_coalesce_and_the_rest_do_not() {
        assert!(coalescable(&post(Some("3")), b"abc"));
        assert!(coalescable(&post(None), b""));
        assert!(!coalescable(&post(Some("4")), b"abc"));
        assert!(!coalescable(&post(None), b"abc"));
        assert!(!coalescable(
            &post(Some("70000")),
            &vec![b'x'; COALESCE_LIMIT + 1]
        ));
        let mut chunked = post(None);
        chunked
            .insert_header(header::TRANSFER_ENCODING, "chunked")
            .expect("header");
        assert!(!coalescable(&chunked, b"abc"));
        let mut close = post(Some("3"));
        close
            .insert_header(header::CONNECTION, "close")
            .expect("header");
        assert!(!coalescable(&close, b"abc"));
    }
}
