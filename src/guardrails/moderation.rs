//! The `moderation` kind: `POST <base_url>/moderations` with `{"model", "input"}` to the
//! profile's provider, straight to it (not through the plan: moderation is not a model the
//! catalog routes), with the provider's first usable credential, on the gateway's own
//! [`Connector`] (its pool and TLS, as the hold path's attempts and the probes use it).
//! Flagged when the answer's `results[0].flagged` is true; any other answer — a non-2xx
//! status, a body that is not that shape, a connection that fails — makes the check
//! unavailable. The caller bounds it with the profile's timeout.

use bytes::Bytes;
use pingora_core::connectors::http::Connector;
use pingora_http::RequestHeader;
use serde::Deserialize;

use crate::catalog::Catalog;
use crate::catalog::ProviderIdx;

/// The largest moderation answer read.
const MAX_ANSWER: usize = 1 << 20;

/// Why a moderation call gave no verdict (never the provider's words or the input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    NoAddress,
    NoCredential,
    Connect,
    Status(u16),
    BadAnswer,
}

/// Ask `provider`'s moderation endpoint (`path`) about `input` with `model`.
pub async fn flags(
    connector: &Connector,
    catalog: &Catalog,
    provider: ProviderIdx,
    path: &str,
    model: &str,
    input: &str,
) -> Result<bool, Unavailable> {
    let p = catalog
        .providers
        .get(provider.get())
        .ok_or(Unavailable::NoAddress)?;
    let peer = p.peer().ok_or(Unavailable::NoAddress)?;
    let peer = &*peer;
    let credential = p
        .credentials
        .iter()
        .find(|c| c.usable)
        .ok_or(Unavailable::NoCredential)?;
    let body = Bytes::from(serde_json::json!({ "model": model, "input": input }).to_string());
    let mut req =
        RequestHeader::build("POST", path.as_bytes(), Some(6)).map_err(|_| Unavailable::Connect)?;
    let header = |req: &mut RequestHeader, name: http::HeaderName, value: http::HeaderValue| {
        req.insert_header(name, value)
            .map_err(|_| Unavailable::Connect)
    };
    header(&mut req, http::header::HOST, p.host_header.clone())?;
    header(
        &mut req,
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    )?;
    header(
        &mut req,
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body.len()),
    )?;
    header(
        &mut req,
        http::header::USER_AGENT,
        http::HeaderValue::from_static("signalbox-guardrail"),
    )?;
    for (name, value) in &p.headers {
        header(&mut req, name.clone(), value.clone())?;
    }
    if let Some(auth) = &credential.auth {
        header(
            &mut req,
            auth.header_name().clone(),
            auth.header_value().clone(),
        )?;
    }
    let (mut session, _) = connector
        .get_http_session(peer)
        .await
        .map_err(|_| Unavailable::Connect)?;
    session.set_read_timeout(peer.options.read_timeout);
    session.set_write_timeout(peer.options.write_timeout);
    session
        .write_request_header(Box::new(req))
        .await
        .map_err(|_| Unavailable::Connect)?;
    session
        .write_request_body(body, true)
        .await
        .map_err(|_| Unavailable::Connect)?;
    session
        .finish_request_body()
        .await
        .map_err(|_| Unavailable::Connect)?;
    session
        .read_response_header()
        .await
        .map_err(|_| Unavailable::Connect)?;
    let status = session.response_header().map_or(0, |h| h.status.as_u16());
    let mut answer = Vec::new();
    while let Some(chunk) = session
        .read_response_body()
        .await
        .map_err(|_| Unavailable::Connect)?
    {
        if answer.len() + chunk.len() > MAX_ANSWER {
            return Err(Unavailable::BadAnswer);
        }
        answer.extend_from_slice(&chunk);
    }
    if !(200..300).contains(&status) {
        return Err(Unavailable::Status(status));
    }
    connector
        .release_http_session(session, peer, Some(crate::catalog::UPSTREAM_IDLE))
        .await;
    verdict(&answer).ok_or(Unavailable::BadAnswer)
}

/// `results[0].flagged` of an OpenAI moderation answer.
fn verdict(answer: &[u8]) -> Option<bool> {
    #[derive(Deserialize)]
    struct Answer {
        results: Vec<Result>,
    }
    #[derive(Deserialize)]
    struct Result {
        flagged: bool,
    }
    let a: Answer = serde_json::from_slice(answer).ok()?;
    a.results.first().map(|r| r.flagged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_result_decides() {
        assert_eq!(
            verdict(br#"{"id":"m","results":[{"flagged":true,"categories":{}}]}"#),
            Some(true)
        );
        assert_eq!(verdict(br#"{"results":[{"flagged":false}]}"#), Some(false));
        assert_eq!(verdict(br#"{"results":[]}"#), None);
        assert_eq!(verdict(br#"{"error":{"message":"x"}}"#), None);
        assert_eq!(verdict(b"not json"), None);
    }
}
