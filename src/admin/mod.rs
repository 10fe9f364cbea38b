//! The admin listener (loopback by default), separate from the proxy listener so scraping and
//! operating never compete with traffic and are never exposed where the proxy port is.
//!
//! | endpoint | token | does |
//! |---|---|---|
//! | `GET`/`HEAD /metrics`, `GET /healthz`, `GET /admin/ready` | none | Prometheus text; liveness; readiness |
//! | `GET /admin/health` | read | every target, credential, degraded mode |
//! | `POST /admin/explain[?key=]` | read | why a request would go where it goes (against a draft config when the body carries one) |
//! | `GET /admin/config` · `PUT /admin/config` · `POST /admin/reload` | read · write · write | the running config · replace it · re-read the file |
//! | `GET`/`PUT /admin/policies/{name}`, `/admin/rules`, `/admin/chains/{name}` | read/write | one section |
//! | `DELETE /admin/policies/{name}` | write | remove a policy no rule names |
//! | `POST /admin/chains/{name}/sort/{smartest,fastest,budget}` | write | reorder a chain |
//! | `POST /admin/keys` · `DELETE /admin/keys/{id}` | write | create a client key (returned once) · revoke one |
//! | `GET /admin/usage?by=key\|user\|model\|provider&since=&until=` | read | the ledger's aggregates |
//! | `POST`/`DELETE /admin/routing/examples` · `GET /admin/routing/status` | write · read | the knn router's pools (`crate::knn::admin`) |
//!
//! Tokens (`admin.token_env`, `admin.read_token_env`) come as `Authorization: Bearer`, compared
//! in constant time over digests. With a token configured, a request without a valid one gets
//! 401; the read token on a write gets 403. With no token configured, reads are served and
//! writes refused (403). Writes go through [`crate::reload::Reloader`]: validated whole, written
//! back to the config file, applied, or refused with every error and its key path.

// An admin refusal is a whole response, returned by value: admin requests are rare and off
// the request path, so the size of the `Err` variant does not matter here.
#![allow(clippy::result_large_err)]

pub mod config;
pub mod health;
mod keys;
pub mod ready;
mod usage;

use crate::catalog::surface::Surface;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{Method, Response};
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::reload::{Grant, Reloader};

pub struct AdminApp {
    reloader: Arc<Reloader>,
    metrics: Arc<Metrics>,
    /// The port the proxy listener was bound on at start (readiness checks it is held).
    proxy_port: Option<u16>,
    /// The ledger `GET /admin/usage` reads, when configured.
    ledger: Option<Arc<Ledger>>,
}

impl AdminApp {
    pub fn new(
        reloader: Arc<Reloader>,
        metrics: Arc<Metrics>,
        proxy_listen: &str,
        ledger: Option<Arc<Ledger>>,
    ) -> Self {
        let proxy_port = proxy_listen
            .parse::<std::net::SocketAddr>()
            .ok()
            .map(|a| a.port());
        Self {
            reloader,
            metrics,
            proxy_port,
            ledger,
        }
    }
}

/// A response with a body and its content type.
pub(crate) fn response(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut r = Response::new(body);
    *r.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(http::header::CONTENT_TYPE, v);
    }
    let len = r.body().len();
    r.headers_mut()
        .insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    r
}

/// A JSON response.
pub(crate) fn json(status: u16, v: &serde_json::Value) -> Response<Vec<u8>> {
    response(status, "application/json", v.to_string().into_bytes())
}

/// An error in the OpenAI shape.
pub(crate) fn error(status: u16, code: &str, message: &str) -> Response<Vec<u8>> {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    response(
        status,
        "application/json",
        crate::error::error_json(message, kind, code).to_vec(),
    )
}

/// The largest request body the admin API reads.
const MAX_BODY: usize = 16 << 20;

/// Read a request body, bounded.
pub(crate) async fn read_body(session: &mut ServerSession) -> Result<Bytes, Response<Vec<u8>>> {
    let mut body = BytesMut::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_BODY => {
                body.extend_from_slice(&chunk);
            }
            Ok(Some(_)) => {
                return Err(error(
                    413,
                    "request_too_large",
                    "the request body is too large",
                ))
            }
            Ok(None) => return Ok(body.freeze()),
            Err(_) => {
                return Err(error(
                    400,
                    "invalid_request",
                    "the request body could not be read",
                ))
            }
        }
    }
}

/// What an endpoint needs from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    Nothing,
    Read,
    Write,
}

impl AdminApp {
    /// Whether the caller may do what `need` asks; the refusal otherwise.
    fn authorize(&self, session: &ServerSession, need: Need) -> Result<(), Response<Vec<u8>>> {
        if need == Need::Nothing {
            return Ok(());
        }
        let tokens = self.reloader.tokens();
        let presented = session
            .req_header()
            .headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(<[u8]>::trim_ascii);
        let grant = tokens.grant(presented);
        match (need, grant, tokens.configured()) {
            (_, Grant::Write, _)
            | (Need::Read, Grant::Read, _)
            | (Need::Read, Grant::None, false) => Ok(()),
            (Need::Write, Grant::Read, _) => Err(error(
                403,
                "read_only_token",
                "the read token may only read",
            )),
            (Need::Write, Grant::None, false) => Err(error(
                403,
                "writes_disabled",
                "no admin token is configured (admin.token_env): writes are refused",
            )),
            _ => Err(error(
                401,
                "invalid_admin_token",
                "send a valid admin token as `Authorization: Bearer <token>`",
            )),
        }
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let method = session.req_header().method.clone();
        let path = session.req_header().uri.path().to_string();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let need = match (&method, parts.as_slice()) {
            (&Method::GET, ["metrics" | "healthz"] | ["admin", "ready"])
            | (&Method::HEAD, ["metrics"]) => Need::Nothing,
            (&Method::GET, ["admin", ..]) | (&Method::POST, ["admin", "explain"]) => Need::Read,
            (&Method::PUT | &Method::POST | &Method::DELETE, ["admin", ..]) => Need::Write,
            _ => Need::Nothing,
        };
        if let Err(refusal) = self.authorize(session, need) {
            return refusal;
        }
        match (&method, parts.as_slice()) {
            // HEAD: the same head, Content-Length included; Pingora sends no body for HEAD.
            (&Method::GET | &Method::HEAD, ["metrics"]) => response(
                200,
                "text/plain; version=0.0.4",
                self.metrics.render().into_bytes(),
            ),
            (&Method::GET, ["healthz"]) => {
                let generation = self.reloader.router().snapshot.load().generation;
                json(
                    200,
                    &serde_json::json!({
                        "status": "ok",
                        "config_generation": generation,
                        // Which process answers: during an upgrade, the old or the new.
                        "pid": std::process::id(),
                    }),
                )
            }
            (&Method::GET, ["admin", "ready"]) => {
                let (router, port) = (self.reloader.router().clone(), self.proxy_port);
                // Reads `/proc`: off the admin runtime's workers.
                tokio::task::spawn_blocking(move || ready::ready(&router, port))
                    .await
                    .unwrap_or_else(|_| json(500, &serde_json::json!({ "ready": false })))
            }
            (&Method::GET, ["admin", "health"]) => {
                json(200, &health::render(self.reloader.router()))
            }
            (&Method::POST, ["admin", "explain"]) => self.explain(session).await,
            (_, ["admin", "config" | "reload" | "policies" | "rules" | "chains", ..]) => {
                config::handle(&self.reloader, session, &method, &parts[1..]).await
            }
            (_, ["admin", "keys", ..]) => {
                keys::handle(&self.reloader, session, &method, &parts[1..]).await
            }
            (_, ["admin", "routing", ..]) => {
                crate::knn::admin::handle(self.reloader.router(), session, &method, &parts[1..])
                    .await
            }
            (&Method::GET, ["admin", "usage"]) => {
                let query = session.req_header().uri.query().map(str::to_string);
                usage::handle(self.ledger.as_deref(), query.as_deref()).await
            }
            _ => error(404, "not_found", "no such admin endpoint"),
        }
    }
}

impl AdminApp {
    /// `POST /admin/explain`: the body is a request as a caller would send it, with its
    /// `x-llm-*` headers; the answer is the explanation (see `snapshot::explain`).
    async fn explain(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let body = match read_body(session).await {
            Ok(b) => b,
            Err(refusal) => return refusal,
        };
        // `?endpoint=/v1/messages`: the endpoint the request would be sent to (default chat
        // completions); it decides which providers can serve it.
        let endpoint = session
            .req_header()
            .uri
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("endpoint=")));
        let surface = match endpoint {
            None => Surface::ChatCompletions,
            Some(path) => match Surface::from_path(path) {
                Some(s) => s,
                None => {
                    return error(
                        400,
                        "invalid_request",
                        &format!("endpoint {path:?} is not one signalbox serves"),
                    )
                }
            },
        };
        // `?key=<id>`: as that client key would send it.
        let key = session
            .req_header()
            .uri
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("key=")))
            .map(str::to_owned);
        let caller = crate::snapshot::explain::Caller {
            key: key.as_deref(),
            ..Default::default()
        };
        // Owned: a knn entry's embedding is awaited before the explanation.
        let headers = session.req_header().headers.clone();
        // A draft: `{"config": <document>, "request": {...}, "headers": {...}}`.
        let draft = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(|v| v.get("config").is_some());
        let Some(draft) = draft else {
            let answer = crate::snapshot::explain::explain_embedded(
                self.reloader.router(),
                surface,
                body,
                &headers,
                caller,
            )
            .await;
            return json(200, &answer);
        };
        let doc = match serde_yaml::to_value(&draft["config"]) {
            Ok(d) => d,
            Err(_) => {
                return error(
                    400,
                    "invalid_request",
                    "`config` cannot be a config document",
                )
            }
        };
        let request = match draft.get("request") {
            Some(r @ serde_json::Value::Object(_)) => bytes::Bytes::from(r.to_string()),
            _ => {
                return error(
                    400,
                    "invalid_request",
                    "a draft explain needs `request`: the request as a caller would send it",
                )
            }
        };
        // The draft's own headers (by lower-case name); without them, this request's.
        let draft_headers: Option<Vec<(String, Vec<u8>)>> =
            draft.get("headers").and_then(|h| h.as_object()).map(|h| {
                h.iter()
                    .filter_map(|(k, v)| {
                        Some((k.to_ascii_lowercase(), v.as_str()?.as_bytes().to_vec()))
                    })
                    .collect()
            });
        let reloader = self.reloader.clone();
        let built = tokio::task::spawn_blocking(move || reloader.draft(&doc))
            .await
            .unwrap_or_else(|e| {
                Err(crate::reload::ReloadError::Io(format!(
                    "the draft was not built: {e}"
                )))
            });
        let draft = match built {
            Ok(d) => d,
            Err(e) => return config::applied(Err(e), |_| serde_json::Value::Null),
        };
        let answer = crate::snapshot::explain::explain_draft(
            self.reloader.router(),
            draft,
            surface,
            request,
            |name| match &draft_headers {
                Some(h) => h.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice()),
                None => headers.get(name).map(http::HeaderValue::as_bytes),
            },
            caller,
        );
        json(200, &answer)
    }
}
