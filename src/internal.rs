//! Internal calls: the gateway asking one of its own catalog models something (an embedding for
//! the knn router, a classifier guardrail's verdict, a recommendation) *through its own proxy
//! listener*, so the call is planned, admitted, failed over, health-scored, metered and
//! recorded exactly like a caller's request. Nothing here routes or retries: the request path
//! does.
//!
//! An internal request carries a per-process random token (`x-llm-internal-token`, compared in
//! constant time). Intake recognises it (`RequestCtx::internal`): it needs no client key, or
//! acts as the key named in `x-llm-internal-key` (a recommendation is billed to its caller),
//! and runs no guardrail and no knn selection (so nothing recurses). Both headers start
//! `x-llm-`, which never reaches a provider (`proxy::headers::to_provider_from`), and neither is
//! ever logged.
//!
//! The connection goes to the address the proxy listener was bound on (an unspecified address
//! becomes loopback), in TLS when the listener terminates it (our own certificate: not
//! verified), through a Pingora [`Connector`] with its own pool.

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora_core::connectors::http::Connector;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::RequestHeader;
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

/// The header carrying the process's token.
pub const TOKEN_HEADER: HeaderName = HeaderName::from_static("x-llm-internal-token");
/// The header naming the client key an internal call acts as.
pub const KEY_HEADER: HeaderName = HeaderName::from_static("x-llm-internal-key");

/// The most an internal answer may hold (an embedding batch is the largest).
const MAX_ANSWER: usize = 32 << 20;
/// How long an idle connection to the own listener stays pooled.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Why an internal call gave no answer. Says nothing of the input or any secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InternalError {
    /// The deadline passed first.
    Timeout,
    /// The gateway could not serve it: no listener yet, no connection, or an error status.
    Unavailable(String),
    /// An answer came that is not what the endpoint promises.
    BadAnswer(String),
}

impl fmt::Display for InternalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout => f.write_str("the internal call timed out"),
            Self::Unavailable(why) => write!(f, "the internal call was not served: {why}"),
            Self::BadAnswer(why) => write!(f, "the internal call's answer is unusable: {why}"),
        }
    }
}

impl std::error::Error for InternalError {}

/// Where the own proxy listener is.
struct Listener {
    peer: HttpPeer,
    host: HeaderValue,
}

/// The client of internal calls, one per running gateway (on [`crate::snapshot::Runtime`]).
pub struct InternalClient {
    token: HeaderValue,
    /// The token's bytes, for the constant-time comparison.
    token_bytes: Box<[u8]>,
    listener: OnceLock<Listener>,
    connector: Connector,
}

impl fmt::Debug for InternalClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the token.
        f.debug_struct("InternalClient")
            .field("listener", &self.listener.get().map(|l| l.peer.to_string()))
            .finish_non_exhaustive()
    }
}

impl Default for InternalClient {
    fn default() -> Self {
        Self::new()
    }
}

impl InternalClient {
    /// A client with a fresh random token and no listener yet.
    pub fn new() -> Self {
        let token = hex::encode(random_bytes());
        Self {
            token_bytes: token.as_bytes().into(),
            // 64 hex digits: always a valid header value.
            token: HeaderValue::from_str(&token).unwrap_or(HeaderValue::from_static("-")),
            listener: OnceLock::new(),
            connector: Connector::new(None),
        }
    }

    /// Point the client at the proxy listener's address (`listen.proxy`), once, at start.
    /// `tls`: the listener terminates TLS.
    pub fn set_listener(&self, addr: &str, tls: bool) -> Result<(), String> {
        let addr: SocketAddr = addr
            .parse()
            .map_err(|e| format!("listen.proxy `{addr}`: {e}"))?;
        let ip = match addr.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let target = SocketAddr::new(ip, addr.port());
        let mut peer = HttpPeer::new(target, tls, "localhost".to_string());
        if tls {
            // Our own listener, reached over loopback: its certificate names the public host.
            peer.options.verify_cert = false;
            peer.options.verify_hostname = false;
        }
        let host = HeaderValue::from_str(&target.to_string())
            .map_err(|e| format!("listen.proxy `{addr}`: {e}"))?;
        // A second call (a test building two servers on one runtime) keeps the first.
        let _ = self.listener.set(Listener { peer, host });
        Ok(())
    }

    /// Whether `headers` carry this process's token.
    pub fn recognises(&self, headers: &HeaderMap) -> bool {
        headers
            .get(TOKEN_HEADER)
            .is_some_and(|v| bool::from(v.as_bytes().ct_eq(&self.token_bytes)))
    }

    /// Ask a catalog chat model (or a policy or alias name) through the gateway's own plan:
    /// `system` (optional) and `user` as the messages, not streamed; the assistant's text.
    /// `on_behalf`: the client key id the call is admitted, limited and billed as (`None`: an
    /// internal call, no key).
    pub async fn chat(
        &self,
        model: &str,
        system: Option<&str>,
        user: &str,
        on_behalf: Option<&str>,
        deadline: Duration,
    ) -> Result<String, InternalError> {
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": user}));
        let body = json!({"model": model, "messages": messages, "stream": false});
        let answer = self
            .post("/v1/chat/completions", &body, on_behalf, deadline)
            .await?;
        chat_text(&answer)
    }

    /// Embed `inputs` through the plan for `model` (`POST /v1/embeddings`): one vector per
    /// input, in input order.
    pub async fn embed(
        &self,
        model: &str,
        inputs: &[&str],
        deadline: Duration,
    ) -> Result<Vec<Vec<f32>>, InternalError> {
        let body = json!({"model": model, "input": inputs});
        let answer = self.post("/v1/embeddings", &body, None, deadline).await?;
        embeddings(&answer, inputs.len())
    }

    /// POST a JSON body to the own listener; the answer's JSON on a 2xx.
    pub async fn post(
        &self,
        path: &str,
        body: &Value,
        on_behalf: Option<&str>,
        deadline: Duration,
    ) -> Result<Value, InternalError> {
        match tokio::time::timeout(deadline, self.exchange(path, body, on_behalf)).await {
            Ok(answer) => answer,
            Err(_) => Err(InternalError::Timeout),
        }
    }

    async fn exchange(
        &self,
        path: &str,
        body: &Value,
        on_behalf: Option<&str>,
    ) -> Result<Value, InternalError> {
        let unavailable = |why: &str| InternalError::Unavailable(why.to_string());
        let listener = self
            .listener
            .get()
            .ok_or_else(|| unavailable("the proxy listener is not up"))?;
        let body = Bytes::from(
            serde_json::to_vec(body).map_err(|_| unavailable("the request did not encode"))?,
        );
        let mut req = RequestHeader::build("POST", path.as_bytes(), Some(6))
            .map_err(|_| unavailable("bad path"))?;
        let headers = [
            (http::header::HOST, listener.host.clone()),
            (
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (http::header::CONTENT_LENGTH, HeaderValue::from(body.len())),
            (TOKEN_HEADER, self.token.clone()),
        ];
        for (name, value) in headers {
            req.insert_header(name, value)
                .map_err(|_| unavailable("bad header"))?;
        }
        if let Some(key) = on_behalf {
            let value = HeaderValue::from_str(key).map_err(|_| unavailable("bad key id"))?;
            req.insert_header(KEY_HEADER, value)
                .map_err(|_| unavailable("bad header"))?;
        }
        let peer = &listener.peer;
        let (mut session, _) = self
            .connector
            .get_http_session(peer)
            .await
            .map_err(|_| unavailable("no connection to the proxy listener"))?;
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(|_| unavailable("the request was not written"))?;
        session
            .write_request_body(body, true)
            .await
            .map_err(|_| unavailable("the request was not written"))?;
        session
            .finish_request_body()
            .await
            .map_err(|_| unavailable("the request was not written"))?;
        session
            .read_response_header()
            .await
            .map_err(|_| unavailable("no answer"))?;
        let status = session.response_header().map_or(0, |h| h.status.as_u16());
        let mut answer = Vec::new();
        loop {
            match session.read_response_body().await {
                Ok(Some(chunk)) => {
                    if answer.len() + chunk.len() > MAX_ANSWER {
                        return Err(InternalError::BadAnswer("the answer is too large".into()));
                    }
                    answer.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(_) => return Err(unavailable("the answer broke off")),
            }
        }
        self.connector
            .release_http_session(session, peer, Some(POOL_IDLE))
            .await;
        let json: Option<Value> = serde_json::from_slice(&answer).ok();
        if !(200..300).contains(&status) {
            // The gateway's own error code says why (never the input).
            let code = json
                .as_ref()
                .and_then(|j| {
                    j.pointer("/error/code")
                        .or_else(|| j.pointer("/error/type"))
                })
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            return Err(InternalError::Unavailable(format!(
                "status {status} ({code})"
            )));
        }
        json.ok_or_else(|| InternalError::BadAnswer("not JSON".into()))
    }
}

/// The assistant's text of a chat completion.
fn chat_text(answer: &Value) -> Result<String, InternalError> {
    answer
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| InternalError::BadAnswer("no message content".into()))
}

/// The vectors of an embeddings answer, by `index`, checked against the number of inputs.
fn embeddings(answer: &Value, inputs: usize) -> Result<Vec<Vec<f32>>, InternalError> {
    let bad = |why: &str| InternalError::BadAnswer(why.to_string());
    let data = answer
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no data"))?;
    if data.len() != inputs {
        return Err(bad("one vector per input was not given"));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs];
    for (position, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map_or(position, |i| i as usize);
        let slot = vectors
            .get_mut(index)
            .ok_or_else(|| bad("index out of range"))?;
        let values = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("an embedding is not an array of numbers"))?;
        let vector = values
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad("an embedding is not an array of numbers"))?;
        if vector.is_empty() {
            return Err(bad("an empty embedding"));
        }
        *slot = Some(vector);
    }
    vectors
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| bad("an input has no vector"))
}

/// 32 bytes from the operating system's random source; without one (never on Linux), the
/// standard library's randomly keyed hasher stands in.
fn random_bytes() -> [u8; 32] {
    let mut raw = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut raw));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        for chunk in raw.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_differ_and_are_recognised_only_exactly() {
        let a = InternalClient::new();
        let b = InternalClient::new();
        assert_ne!(a.token, b.token);
        let mut headers = HeaderMap::new();
        headers.insert(TOKEN_HEADER, a.token.clone());
        assert!(a.recognises(&headers));
        assert!(!b.recognises(&headers));
        headers.insert(TOKEN_HEADER, HeaderValue::from_static("guess"));
        assert!(!a.recognises(&headers));
        assert!(!a.recognises(&HeaderMap::new()));
    }

    #[test]
    fn the_debug_form_never_shows_the_token() {
        let a = InternalClient::new();
        let shown = format!("{a:?}");
        assert!(!shown.contains(a.token.to_str().unwrap_or("?")), "{shown}");
    }

    #[test]
    fn embeddings_are_put_in_input_order() {
        let answer = json!({"data": [
            {"index": 1, "embedding": [0.0, 1.0]},
            {"index": 0, "embedding": [1.0, 0.0]},
        ]});
        let v = embeddings(&answer, 2).unwrap();
        assert_eq!(v, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert!(embeddings(&answer, 3).is_err());
        assert!(embeddings(&json!({"data": [{"embedding": "x"}]}), 1).is_err());
    }

    #[test]
    fn unspecified_listen_addresses_become_loopback() {
        let c = InternalClient::new();
        c.set_listener("0.0.0.0:8080", false).unwrap();
        let l = c.listener.get().unwrap();
        assert_eq!(l.host, "127.0.0.1:8080");
        assert!(InternalClient::new()
            .set_listener("nowhere", false)
            .is_err());
    }
}
