//! The admin listener (loopback by default): `/metrics` in Prometheus text, `/healthz` for
//! liveness, `/admin/health` for the health of every target and `POST /admin/explain` for why
//! a request would go where it goes. Separate from the proxy
//! listener, so scraping never competes with traffic and is never exposed where the proxy
//! port is.

pub mod health;

use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;

use crate::metrics::Metrics;
use crate::routing::Router;

pub struct AdminApp {
    router: Arc<Router>,
    metrics: Arc<Metrics>,
}

impl AdminApp {
    pub fn new(router: Arc<Router>, metrics: Arc<Metrics>) -> Self {
        Self { router, metrics }
    }
}

fn response(status: u16, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
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

/// The largest request body `POST /admin/explain` reads.
const MAX_EXPLAIN_BODY: usize = 16 << 20;

impl AdminApp {
    /// `POST /admin/explain`: the body is a request as a caller would send it, with its
    /// `x-llm-*` headers; the answer is the explanation (see `routing::explain`).
    async fn explain(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if session.req_header().method != http::Method::POST {
            return response(
                405,
                "application/json",
                crate::error::error_json(
                    "POST a request body to explain",
                    "invalid_request_error",
                    "method_not_allowed",
                )
                .to_vec(),
            );
        }
        let mut body = bytes::BytesMut::new();
        loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_EXPLAIN_BODY => {
                    body.extend_from_slice(&chunk);
                }
                Ok(Some(_)) => {
                    return response(
                        413,
                        "application/json",
                        crate::error::error_json(
                            "the request body is too large to explain",
                            "invalid_request_error",
                            "request_too_large",
                        )
                        .to_vec(),
                    )
                }
                Ok(None) => break,
                Err(_) => {
                    return response(
                        400,
                        "application/json",
                        crate::error::error_json(
                            "the request body could not be read",
                            "invalid_request_error",
                            "invalid_request",
                        )
                        .to_vec(),
                    )
                }
            }
        }
        let headers = &session.req_header().headers;
        let answer = crate::routing::explain::explain(&self.router, body.freeze(), |name| {
            headers.get(name).map(http::HeaderValue::as_bytes)
        });
        response(200, "application/json", answer.to_string().into_bytes())
    }
}

#[async_trait]
impl ServeHttp for AdminApp {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let path = session.req_header().uri.path().to_string();
        if path == "/admin/explain" {
            return self.explain(session).await;
        }
        match path.as_str() {
            "/metrics" => response(
                200,
                "text/plain; version=0.0.4",
                self.metrics.render().into_bytes(),
            ),
            "/healthz" => {
                let generation = self.router.tables.load().generation;
                response(
                    200,
                    "application/json",
                    format!("{{\"status\":\"ok\",\"config_generation\":{generation}}}")
                        .into_bytes(),
                )
            }
            "/admin/health" => response(
                200,
                "application/json",
                health::render(&self.router).to_string().into_bytes(),
            ),
            _ => response(
                404,
                "application/json",
                crate::error::error_json(
                    "no such admin endpoint",
                    "invalid_request_error",
                    "not_found",
                )
                .to_vec(),
            ),
        }
    }
}
