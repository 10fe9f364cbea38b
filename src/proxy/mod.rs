//! The Pingora `ProxyHttp` implementation: each hook delegates to the room that owns its
//! concern, in the order a request flows through them.
//!
//! ```text
//! early_request_filter     edge      Pingora accepted the head: the edge lets it through
//! request_filter           intake    read + bound the body, scan it once; planning: resolve
//!                                    the model, build the plan from the request's snapshot,
//!                                    fix its attempt rules, take the first target (or
//!                                    answer); driven: what must be held until its commit
//!                                    point (whole answers, held streams, translations, bodies
//!                                    only signalbox can replay) is served here, attempt by
//!                                    attempt, and Pingora only logs; guard: guardrails,
//!                                    once, between admission and the first attempt
//! upstream_peer            fast      the next target as an HttpPeer (after its backoff)
//! upstream_request_filter  attempt   per-target header rewrite: auth, host, path, length
//! request_body_filter      attempt   Pingora replays its retry-buffer tail: swap in the body
//! upstream_response_filter fast      judge the status; a failover status returns Err before
//!                                    the header reaches the client, so Pingora's loop calls
//!                                    upstream_peer again
//! response_filter          fast      routing headers; from here on the request is committed
//! response_body_filter     fast      the relay (model rewrite, JSON / SSE), and at the end
//!                                    how the attempt ended (a broken stream's error event)
//! fail_to_connect,         fast      judge, settle, take the next attempt: Pingora retries
//! error_while_proxy                  iff one may run and nothing reached the client
//! fail_to_proxy            fast      the final answer in signalbox's words (or an SSE event)
//! logging                  emit      metrics, ledger rows and the access line, once
//! ```
//!
//! Both drivers — `fast` (Pingora's proxy loop) and `driven` (signalbox's own) — describe what
//! the provider sent to the verdict core (`crate::attempt`) and apply its verdict through
//! `settle`: the one place an attempt's outcome reaches health, the request's failure log and
//! the next target. `response` is the header and body handling they share; `respond` writes
//! what signalbox answers itself (errors, `/v1/models`, routing headers); `ctx` is the typed
//! context; `body` is how any body size is replayed; `heap` makes the futures of the large,
//! short-lived phases on the heap; `wire` sends the driven path's request head and a known
//! body in one write; `bounded` and `wheel` bound waits (a timer only once one waits; the
//! attempts' and the edge's deadlines on a coarse wheel of shared 10 ms buckets).

pub mod access;
pub mod admission;
pub mod attempt;
pub mod body;
pub mod bounded;
pub mod ctx;
pub mod driven;
pub mod emit;
pub mod fast;
pub mod guard;
pub mod headers;
pub mod heap;
pub mod hedge;
pub mod intake;
pub mod planning;
pub mod respond;
pub mod response;
pub mod settle;
pub mod wheel;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::http::Connector;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Error;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use self::ctx::RequestCtx;
use crate::ledger::Ledger;
use crate::metrics::Metrics;
use crate::snapshot::Runtime;
use crate::state::admit::SharedAdmission;

/// The signalbox proxy.
pub struct Gateway {
    runtime: Arc<Runtime>,
    metrics: Arc<Metrics>,
    /// The hold path's upstream connections (the fast path uses Pingora's own).
    connector: Arc<Connector>,
    /// Where every attempt is recorded (`ledger`), when configured.
    ledger: Option<Arc<Ledger>>,
    /// Exact admission of keys' limits across replicas (`state.limits: exact` with Redis).
    shared: Option<Arc<SharedAdmission>>,
}

impl Gateway {
    pub fn new(
        runtime: Arc<Runtime>,
        metrics: Arc<Metrics>,
        connector: Arc<Connector>,
        ledger: Option<Arc<Ledger>>,
        shared: Option<Arc<SharedAdmission>>,
    ) -> Self {
        Self {
            runtime,
            metrics,
            connector,
            ledger,
            shared,
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context inside its per-request future, which it moves into a
    /// fresh box for every request on a connection; a pointer there instead of ~1 KiB of
    /// state keeps that copy (and every stream's resident future) smaller.
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Self::CTX {
        // The one snapshot load of the request: kept for its whole life.
        Box::new(RequestCtx::new(self.runtime.snapshot.load_full()))
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        crate::edge::admit(session);
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<bool> {
        intake::admit(
            session,
            ctx,
            &self.runtime,
            &self.metrics,
            &self.connector,
            self.shared.as_deref(),
        )
        .await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<Box<HttpPeer>> {
        fast::peer(ctx, self.shared.as_deref()).await
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        attempt::rewrite_request_header(ctx, upstream_request)
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()>
    where
        Self::CTX: Send + Sync,
    {
        attempt::swap_body(ctx, body, end_of_stream);
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        fast::on_upstream_header(ctx, upstream_response)
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        fast::on_header(&self.runtime, ctx, upstream_response);
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<Option<Duration>>
    where
        Self::CTX: Send + Sync,
    {
        fast::on_body(ctx, body, end_of_stream);
        Ok(None)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        e: Box<Error>,
    ) -> Box<Error> {
        fast::on_connect_failure(ctx, e)
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        fast::on_proxy_error(session, ctx, e, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy
    where
        Self::CTX: Send + Sync,
    {
        fast::answer(session, e, ctx).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX)
    where
        Self::CTX: Send + Sync,
    {
        let req = session.req_header();
        let wire = emit::Wire {
            method: &req.method,
            path: req.uri.path(),
            written: session.response_written().map(|h| h.status.as_u16()),
        };
        emit::emit(ctx, &wire, e, &self.metrics, self.ledger.as_deref());
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, _error: &Error) -> bool {
        // Pingora's line would carry peer details; the access line covers the request.
        true
    }

    fn suppress_proxy_warn_log(
        &self,
        _session: &Session,
        _ctx: &Self::CTX,
        _error: &Error,
        _context: pingora_proxy::ProxyWarnLogContext,
    ) -> bool {
        true
    }

    fn request_summary(&self, session: &Session, ctx: &Self::CTX) -> String {
        format!(
            "{} {} request_id={}",
            session.req_header().method,
            session.req_header().uri.path(),
            ctx.request_id.to_str().unwrap_or("")
        )
    }
}
