//! The Pingora `ProxyHttp` implementation: connects routing decisions to the request's phases.
//!
//! ```text
//! request_filter          read + bound the body, scan it once, resolve the model, build the
//!                         plan from one snapshot load, pick the first target (or answer)
//! upstream_peer           the pending target as an HttpPeer (pre-resolved address, TLS/SNI,
//!                         timeouts); counts the attempt
//! upstream_request_filter per-target header rewrite: auth, host, path, content-length
//! request_body_filter     Pingora replays its retry-buffer tail: swap in the rewritten body
//! upstream_response_filter classify the status; a failover status returns Err before the
//!                         header reaches the client, so Pingora's loop calls upstream_peer again
//! response_filter         routing headers; from here on the request is committed
//! response_body_filter    model rewrite (JSON / SSE), stream accounting, broken-stream events
//! fail_to_connect,        classify, record, pick the next target, retry iff nothing reached
//! error_while_proxy       the client and the budgets allow
//! fail_to_proxy           the final answer in signalbox's words (or an SSE error event)
//! logging                 metrics and the access line, once per request
//! ```
//!
//! Pingora does not stop a retry after bytes reached the client; the `committed` flag (set
//! when a non-informational header goes out, see `response_filter`) is the guard, checked by
//! every failure hook. A `100 Continue` sent for `Expect` does not commit.

pub mod body;
pub mod ctx;
pub mod respond;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::{header, HeaderName, HeaderValue, Method};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::adapters::openai::{sse_error_event, ChatRequest, ResponseRewriter};
use crate::error::{ErrorCode, GatewayError};
use crate::metrics::{status_class_index, Metrics, Outcome};
use crate::retry::{self, StatusVerdict};
use crate::routing::plan::{prefix_hash, Advance, Plan, PlanEnv, RequestFacts};
use crate::routing::scoring::rank;
use crate::routing::session::stable_hash;
use crate::routing::{resolve, Resolution, ResolveError, Router, Strategy, Tables};

use self::body::{BodyError, Framing};
use self::ctx::{Attempt, RequestCtx};

/// State shared by every request: routing (snapshot, rankings, health, sessions) and the
/// metric families.
pub struct GatewayState {
    pub router: Arc<Router>,
    pub metrics: Arc<Metrics>,
}

impl GatewayState {
    pub fn new(router: Arc<Router>, metrics: Arc<Metrics>) -> Self {
        let generation = router.tables.load().generation;
        metrics
            .config_generation
            .set(i64::try_from(generation).unwrap_or(0));
        Self { router, metrics }
    }
}

/// The plan's view of the world for one decision.
fn plan_env<'a>(router: &'a Router, tables: &'a Tables) -> PlanEnv<'a> {
    PlanEnv {
        catalog: &tables.catalog,
        health: &router.health,
        now_ms: router.health.now_ms(),
        degraded: router.health.degraded.is_degraded(),
    }
}

/// The signalbox proxy.
pub struct Gateway {
    state: Arc<GatewayState>,
}

impl Gateway {
    pub fn new(state: Arc<GatewayState>) -> Self {
        Self { state }
    }
}

/// Headers a client may use to authenticate to signalbox; never forwarded upstream.
static CLIENT_AUTH_HEADERS: [HeaderName; 4] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    header::PROXY_AUTHORIZATION,
];
/// Request headers that describe the caller's hop or speak to signalbox, not to the provider.
static HOP_AND_GATEWAY_HEADERS: [HeaderName; 8] = [
    header::EXPECT,
    header::TRANSFER_ENCODING,
    header::ACCEPT_ENCODING,
    respond::names::X_LLM_SESSION,
    respond::names::X_LLM_ROUTE,
    HeaderName::from_static("x-llm-router"),
    HeaderName::from_static("x-llm-metadata"),
    header::COOKIE,
];
/// Response headers of the provider that describe its account, not the answer.
static DROPPED_RESPONSE_HEADERS: [HeaderName; 3] = [
    header::SET_COOKIE,
    HeaderName::from_static("openai-organization"),
    HeaderName::from_static("openai-project"),
];
/// Cap on an upstream `Retry-After` relayed to callers.
const RETRY_AFTER_CAP: Duration = Duration::from_secs(3600);
/// Output tokens assumed when the request does not say (`max_tokens`).
const DEFAULT_OUTPUT_TOKENS: u64 = 256;

fn gateway_error(code: ErrorCode, message: &'static str) -> GatewayError {
    GatewayError::new(code, message)
}

impl Gateway {
    /// Everything before the first attempt. `Ok(true)` when signalbox answered itself.
    async fn prepare(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> pingora_error::Result<bool> {
        let router = self.state.router.clone();
        let tables = router.tables.load_full();
        ctx.route = Some(tables.unresolved);
        ctx.tables = Some(tables.clone());
        ctx.router = Some(router.clone());
        self.state.metrics.in_flight.inc();
        ctx.in_flight = true;

        let req = session.req_header();
        if req.method == Method::GET && matches!(req.uri.path(), "/v1/models" | "/models") {
            let body = respond::models_body(&tables);
            respond::write_json(session, ctx, 200, body, None).await?;
            return Ok(true);
        }
        let admitted = match check_request_line(session, &tables) {
            Err(refusal) => Err(refusal),
            Ok(()) => match read_request(session, &tables).await? {
                Err(refusal) => Err(refusal),
                Ok(request) => plan_request(session, ctx, &router, &tables, request),
            },
        };
        match admitted {
            Ok(()) => Ok(false),
            Err(refusal) => {
                respond::write_error(session, ctx, refusal).await?;
                Ok(true)
            }
        }
    }

    /// After a failed attempt: record it and decide whether another attempt may run.
    /// Returns whether Pingora should retry (call `upstream_peer` again).
    fn after_failure(&self, ctx: &mut RequestCtx, outcome: Outcome, advance: Advance) -> bool {
        let failed = ctx.current.map(|a| a.target);
        let failed_ref = ctx.guard.as_ref().map(crate::health::InflightGuard::target);
        ctx.finish_attempt(outcome);
        ctx.failures.record(outcome);
        let (Some(tables), Some(router)) = (ctx.tables.clone(), ctx.router.clone()) else {
            return false;
        };
        let Some(plan) = ctx.plan.as_mut() else {
            return false;
        };
        ctx.pending = None;
        if ctx.attempts >= tables.failover.max_attempts {
            return false;
        }
        // The first attempt and the first retry always run; later ones only within the deadline.
        if let Some(deadline) = tables.failover.deadline {
            if ctx.attempts >= 2 && ctx.started.elapsed() >= deadline {
                return false;
            }
        }
        // Same-target retry: a transient failure, budget left, and the breaker (which has
        // just seen this failure) still admits the target. Never for a half-open probe.
        if let (Some(target), Some(target_ref)) = (failed, failed_ref) {
            // Cheapest checks first: with retries off (the default) health is not consulted.
            if ctx.transient_retries < tables.failover.transient_retries
                && !target.probe
                && retry::is_transient(outcome)
                && matches!(
                    router.health.admission(target_ref, router.health.now_ms()),
                    crate::health::Admission::Healthy { .. }
                )
            {
                ctx.transient_retries += 1;
                ctx.pending = Some(target);
                return true;
            }
        }
        ctx.transient_retries = 0;
        ctx.pending = plan.next(&plan_env(&router, &tables), advance);
        ctx.pending.is_some()
    }

    /// Whether bytes of a final response already went to the client.
    fn committed(session: &Session, ctx: &RequestCtx) -> bool {
        ctx.committed
            || session
                .response_written()
                .is_some_and(|r| !r.status.is_informational())
    }
}

/// The request line and headers: the endpoint, the method, the header budget.
fn check_request_line(session: &Session, tables: &Tables) -> Result<(), GatewayError> {
    let req = session.req_header();
    let path = req.uri.path();
    if !matches!(
        path,
        "/v1/chat/completions" | "/chat/completions" | "/v1/models" | "/models"
    ) {
        return Err(gateway_error(
            ErrorCode::NotFound,
            "no such endpoint; signalbox serves POST /v1/chat/completions and GET /v1/models",
        ));
    }
    if req.method != Method::POST || path.ends_with("models") {
        return Err(gateway_error(
            ErrorCode::MethodNotAllowed,
            "this endpoint does not take this method",
        ));
    }
    let header_bytes: usize = req
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if header_bytes > tables.limits.max_request_headers {
        return Err(gateway_error(
            ErrorCode::HeadersTooLarge,
            "the request headers exceed the gateway's limit",
        ));
    }
    Ok(())
}

/// Read the whole body (bounded, arranged so Pingora replays it on every attempt) and scan it.
/// A refusal that leaves body bytes unread also closes the connection after the answer.
async fn read_request(
    session: &mut Session,
    tables: &Tables,
) -> pingora_error::Result<Result<ChatRequest, GatewayError>> {
    let limit = tables.limits.max_request_body;
    let too_large = |session: &mut Session| {
        session.set_keepalive(None);
        GatewayError::new(
            ErrorCode::RequestTooLarge,
            format!("the request body exceeds the gateway's limit of {limit} bytes"),
        )
    };
    let framing = body::framing(session);
    if let Framing::Length(n) = framing {
        if n > limit {
            return Ok(Err(too_large(session)));
        }
    }
    let expects_continue = session
        .req_header()
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects_continue {
        session.as_mut().write_continue_response().await?;
    }
    let body = match body::read_whole_body(session, framing, limit).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return Ok(Err(too_large(session))),
        Err(BodyError::ChunkedTooLarge) => {
            session.set_keepalive(None);
            return Ok(Err(gateway_error(
                ErrorCode::LengthRequired,
                "chunked request bodies over 64KiB are not accepted; send a Content-Length",
            )));
        }
        Err(BodyError::NotReplayable) => {
            return Ok(Err(gateway_error(
                ErrorCode::HeadersTooLarge,
                "the request arrived in a way the gateway cannot replay (very large headers ahead of the body); reduce the headers",
            )));
        }
        Err(BodyError::Read(e)) => return Err(e),
    };
    Ok(ChatRequest::parse(body)
        .map_err(|e| GatewayError::new(ErrorCode::InvalidRequest, e.message())))
}

/// Resolve the model, build the plan from one snapshot and pick the first target. Pure but
/// for what it records in `ctx` (and the route's round-robin turn).
fn plan_request(
    session: &Session,
    ctx: &mut RequestCtx,
    router: &Router,
    tables: &Arc<Tables>,
    request: ChatRequest,
) -> Result<(), GatewayError> {
    let resolution = {
        let model = request.model_name();
        resolve(tables, &model).map_err(|e| resolve_error(e, &model))?
    };
    let route_idx = resolution.route();
    ctx.route = Some(route_idx);
    let route = tables.route(route_idx);
    let strategy = match request.routing.as_ref().and_then(|r| r.strategy.as_deref()) {
        None => route.strategy,
        Some(name) => Strategy::parse(name).ok_or_else(|| {
            GatewayError::new(
                ErrorCode::InvalidRequest,
                format!("`routing.strategy`: unknown strategy {:?}", truncate(name)),
            )
        })?,
    };
    ctx.session = session
        .req_header()
        .headers
        .get(respond::names::X_LLM_SESSION)
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(|v| stable_hash(v.as_bytes()));
    let now = router.health.now_ms();
    let facts = RequestFacts {
        input_tokens: respond::estimate_input_tokens(request.body_len()),
        output_tokens: request.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS),
        prefix_hash: (strategy == Strategy::PrefixAffinity)
            .then(|| prefix_hash(request.prompt(), tables.routing.prefix_bytes)),
        session: ctx.session.and_then(|h| router.sessions.get(h, now)),
        round_robin: route
            .round_robin
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        // Request ids are unique per request: a fresh seed for this request's draws.
        seed: stable_hash(ctx.request_id.as_bytes()),
    };
    let mut plan = match resolution {
        Resolution::Route(r) if strategy == route.strategy => {
            Plan::new(router.rankings.load().order(tables, r), strategy, facts)
        }
        // A per-request strategy: rank this route for it now.
        Resolution::Route(_) => Plan::new(
            Arc::from(rank(
                &tables.catalog,
                &router.health,
                &route.candidates,
                strategy,
                tables.routing.custom_weights,
                now,
            )),
            strategy,
            facts,
        ),
        Resolution::Adhoc { deployment, .. } => Plan::adhoc(deployment, facts),
    };
    if let Some(routing) = &request.routing {
        apply_routing_override(tables, routing, &mut plan)?;
    }
    ctx.pending = plan.next(&plan_env(router, tables), Advance::NextDeployment);
    ctx.request = Some(request);
    let refusal = ctx.pending.is_none().then(|| {
        let err = ctx.failures.final_error(&plan);
        if err.code == ErrorCode::NoProviderAvailable {
            // Fail fast: tell the caller when the soonest candidate frees up.
            let secs = plan
                .soonest_ms()
                .map_or(1, |until| until.saturating_sub(now).div_ceil(1000).max(1));
            err.with_retry_after(Some(secs))
        } else {
            err
        }
    });
    ctx.plan = Some(plan);
    refusal.map_or(Ok(()), Err)
}

fn resolve_error(e: ResolveError, model: &str) -> GatewayError {
    // The model name is echoed only when short and printable: it is the caller's own input.
    let shown: String = if model.len() <= 128 && model.bytes().all(|b| b.is_ascii_graphic()) {
        model.to_string()
    } else {
        "(the requested model)".to_string()
    };
    match e {
        ResolveError::ModelNotFound => GatewayError::new(
            ErrorCode::ModelNotFound,
            format!("no model, alias or chain named {shown:?}"),
        ),
        ResolveError::NoActiveChain => GatewayError::new(
            ErrorCode::ModelNotFound,
            "`auto` needs an active chain and none is configured",
        ),
        ResolveError::ChainEmpty => GatewayError::new(
            ErrorCode::ChainEmpty,
            format!("{shown:?} names a chain with no usable model"),
        ),
        ResolveError::ModelDisabled => {
            GatewayError::new(ErrorCode::ModelNotFound, format!("{shown:?} is disabled"))
        }
    }
}

/// Apply the request's `routing` object. It can narrow the plan, never widen it.
fn apply_routing_override(
    tables: &Tables,
    routing: &crate::adapters::openai::RoutingOverride,
    plan: &mut Plan,
) -> Result<(), GatewayError> {
    if let Some(policy) = &routing.policy {
        return Err(GatewayError::new(
            ErrorCode::InvalidRequest,
            format!("`routing.policy`: no policy named {:?}", truncate(policy)),
        ));
    }
    if let Some(strategy) = &routing.strategy {
        if strategy != "priority" {
            return Err(GatewayError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "`routing.strategy`: unknown strategy {:?}",
                    truncate(strategy)
                ),
            ));
        }
    }
    if let Some(providers) = &routing.providers {
        let mut allowed = Vec::with_capacity(providers.len());
        for id in providers {
            match tables.catalog.provider_by_id(id) {
                Some(p) => allowed.push(p.idx),
                None => {
                    return Err(GatewayError::new(
                        ErrorCode::InvalidRequest,
                        format!("`routing.providers`: no provider named {:?}", truncate(id)),
                    ))
                }
            }
        }
        plan.restrict_to(allowed);
    }
    Ok(())
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

fn peer_for(
    tables: &Tables,
    ctx: &RequestCtx,
    target: crate::routing::Target,
) -> Option<(
    HttpPeer,
    crate::catalog::ProviderIdx,
    Option<crate::catalog::DeploymentIdx>,
)> {
    let plan = ctx.plan.as_ref()?;
    let deployment = plan.deployment(&tables.catalog, target.position)?;
    let peer = tables.catalog.provider(deployment.provider).peer()?;
    Some((
        peer,
        deployment.provider,
        deployment.model.map(|_| deployment.idx),
    ))
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context inside its per-request future, which it moves into a
    /// fresh box for every request on a connection; a pointer there instead of ~1 KiB of
    /// state keeps that copy (and every stream's resident future) smaller.
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Self::CTX {
        Box::new(RequestCtx::new())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<bool> {
        self.prepare(session, ctx).await
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<Box<HttpPeer>> {
        let tables = ctx
            .tables
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no routing snapshot"))?;
        let target = ctx
            .pending
            .take()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no target left"))?;
        let (peer, provider, deployment) = peer_for(&tables, ctx, target)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "target has no address"))?;
        // The body this target gets: rebuilt only when the upstream model name changes.
        if let (Some(request), Some(plan)) = (&ctx.request, &ctx.plan) {
            if let Some(d) = plan.deployment(&tables.catalog, target.position) {
                let reuse = ctx
                    .attempt_body
                    .as_ref()
                    .is_some_and(|(lit, _)| *lit == d.upstream_model_json);
                if !reuse {
                    let body = request.body_for(&d.upstream_model_json);
                    ctx.attempt_body = Some((d.upstream_model_json.clone(), body));
                }
            }
        }
        let now = Instant::now();
        if ctx.first_attempt_at.is_none() {
            ctx.first_attempt_at = Some(now);
            ctx.first_was_probe = target.probe;
        }
        ctx.attempts += 1;
        ctx.current = Some(Attempt {
            target,
            provider,
            started: now,
            header_at: None,
        });
        if let Some(router) = &ctx.router {
            let t = crate::health::TargetRef {
                deployment,
                provider,
                credential: target.credential,
            };
            ctx.guard = Some(router.health.begin(t, target.probe));
        }
        ctx.status_outcome = None;
        ctx.retry_after = None;
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        let (Some(tables), Some(attempt), Some(plan)) = (&ctx.tables, &ctx.current, &ctx.plan)
        else {
            return Err(Error::explain(
                ErrorType::InternalError,
                "no attempt in progress",
            ));
        };
        let deployment = plan
            .deployment(&tables.catalog, attempt.target.position)
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no deployment"))?;
        let provider = tables.catalog.provider(deployment.provider);
        let auth = provider.credentials[attempt.target.credential]
            .auth
            .as_ref();
        let len = ctx.attempt_body.as_ref().map_or(0, |(_, b)| b.len());
        respond::edit_request_parts(upstream_request, |parts| {
            let headers = &mut parts.headers;
            for name in CLIENT_AUTH_HEADERS.iter().chain(&HOP_AND_GATEWAY_HEADERS) {
                headers.remove(name);
            }
            if let Some(auth) = auth {
                headers.insert(header::AUTHORIZATION, auth.header_value().clone());
            }
            parts.uri = provider.chat_uri.clone();
            headers.insert(header::HOST, provider.host_header.clone());
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            headers.insert(respond::names::X_REQUEST_ID, ctx.request_id.clone());
        });
        Ok(())
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
        // Pingora hands over its retry-buffer tail (or nothing) once per attempt, with
        // end_of_stream: replace it with the whole rewritten body.
        if end_of_stream {
            *body = ctx.attempt_body.as_ref().map(|(_, b)| b.clone());
        } else {
            *body = None;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        let status = upstream_response.status.as_u16();
        if upstream_response.status.is_informational() {
            return Ok(());
        }
        if let Some(a) = ctx.current.as_mut() {
            a.header_at = Some(Instant::now());
        }
        match retry::classify_status(status) {
            StatusVerdict::Success => {
                let content_type = upstream_response
                    .headers
                    .get(header::CONTENT_TYPE)
                    .map(|v| v.as_bytes())
                    .unwrap_or_default();
                let caller_model = ctx
                    .request
                    .as_ref()
                    .map(ChatRequest::model_literal)
                    .unwrap_or_default();
                if starts_with_ignore_case(content_type, b"text/event-stream") {
                    ctx.is_sse = true;
                    ctx.rewriter = ResponseRewriter::Sse {
                        caller_model,
                        carry: BytesMut::new(),
                    };
                } else if starts_with_ignore_case(content_type, b"application/json") {
                    // Keep the upstream's length framing when the caller's name fits in the
                    // name sent upstream (providers echo it, often longer): the rewrite then
                    // pads instead of changing the length.
                    let sent_len = ctx
                        .attempt_body
                        .as_ref()
                        .map_or(0, |(literal, _)| literal.len());
                    let fixed_len = upstream_response
                        .headers
                        .get(header::CONTENT_LENGTH)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<usize>().ok())
                        .filter(|_| caller_model.len() <= sent_len)
                        .filter(|_| {
                            upstream_response
                                .headers
                                .get(header::CONTENT_ENCODING)
                                .is_none()
                        });
                    ctx.rewriter = ResponseRewriter::Json {
                        caller_model,
                        buf: BytesMut::new(),
                        fixed_len,
                    };
                }
                if ctx.rewriter.changes_length() {
                    respond::edit_response_parts(upstream_response, |parts| {
                        parts.headers.remove(header::CONTENT_LENGTH);
                        parts.headers.remove(header::CONTENT_ENCODING);
                        parts.headers.insert(
                            header::TRANSFER_ENCODING,
                            HeaderValue::from_static("chunked"),
                        );
                    });
                }
                ctx.served = ctx.current;
                Ok(())
            }
            StatusVerdict::Relay => {
                ctx.rewriter = ResponseRewriter::Replace {
                    status,
                    sniff: BytesMut::new(),
                };
                let mut fresh = ResponseHeader::build(status, Some(4))?;
                fresh.insert_header("content-type", "application/json")?;
                fresh.insert_header("transfer-encoding", "chunked")?;
                *upstream_response = fresh;
                ctx.served = ctx.current;
                Ok(())
            }
            StatusVerdict::Failover { outcome, advance } => {
                let wall = ctx
                    .router
                    .as_ref()
                    .map_or_else(std::time::SystemTime::now, |r| r.health.clock.wall());
                ctx.retry_after = upstream_response
                    .headers
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| retry::parse_retry_after(v, wall, RETRY_AFTER_CAP));
                if let (Outcome::RateLimited, Some(wait)) = (outcome, ctx.retry_after) {
                    ctx.failures.note_retry_after(wait.as_secs().max(1));
                }
                ctx.status_outcome = Some((outcome, advance));
                Err(Error::explain(
                    ErrorType::HTTPStatus(status),
                    "upstream status triggers failover",
                )
                .into_up())
            }
        }
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> pingora_error::Result<()> {
        if upstream_response.status.is_informational() {
            return Ok(());
        }
        respond::add_routing_headers(
            upstream_response,
            ctx,
            Instant::now(),
            &DROPPED_RESPONSE_HEADERS,
        );
        ctx.status = Some(upstream_response.status.as_u16());
        ctx.committed = true;
        if upstream_response.status.is_success() {
            bind_session(ctx);
        }
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
        ctx.rewriter.filter(body, end_of_stream, &mut ctx.stream);
        if end_of_stream && ctx.is_sse && !ctx.stream.done && !ctx.stream.upstream_error_event {
            // The upstream ended the stream without its terminator: say so in-band rather
            // than let a truncated answer look complete.
            let (msg, code) = if ctx.stream.data_events == 0 {
                (
                    "the provider ended the stream without producing any output",
                    "upstream_empty_stream",
                )
            } else {
                (
                    "the provider ended the stream before it was complete",
                    "upstream_stream_interrupted",
                )
            };
            let mut out = BytesMut::new();
            if let Some(b) = body.take() {
                out.extend_from_slice(&b);
            }
            out.extend_from_slice(&sse_error_event(msg, code));
            *body = Some(out.freeze());
            ctx.stream_broken = true;
        }
        Ok(None)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Self::CTX,
        mut e: Box<Error>,
    ) -> Box<Error> {
        let outcome = retry::classify_connect_error(&e);
        if outcome == Outcome::LocalError {
            warn_local_resource();
        }
        let retry = self.after_failure(ctx, outcome, Advance::NextDeployment);
        e.set_retry(retry);
        e
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        if Self::committed(session, ctx) {
            // Bytes reached the client: never another attempt.
            ctx.stream_broken = true;
            let outcome = if e.esource() == &ErrorSource::Downstream {
                Outcome::Cancelled
            } else {
                Outcome::StreamBroken
            };
            ctx.finish_attempt(outcome);
            e.set_retry(false);
            return e;
        }
        if e.esource() == &ErrorSource::Downstream && ctx.status_outcome.is_none() {
            // The client went away: not the upstream's fault, nothing to retry for.
            ctx.finish_attempt(Outcome::Cancelled);
            e.set_retry(false);
            return e;
        }
        if let Some((outcome, advance)) = ctx.status_outcome.take() {
            let retry = self.after_failure(ctx, outcome, advance);
            e.set_retry(retry);
            return e;
        }
        let outcome = retry::classify_proxy_error(&e);
        // A pooled connection the upstream had already closed is not a failure of the target:
        // call the same target once more on a fresh connection.
        let stale = client_reused
            && outcome == Outcome::Reset
            && !ctx.retry_same
            && !ctx.current.is_some_and(|a| a.target.probe);
        if stale {
            if let Some(attempt) = ctx.current {
                let max = ctx.tables.as_ref().map_or(0, |t| t.failover.max_attempts);
                ctx.abandon_attempt(Outcome::Reset);
                ctx.retry_same = true;
                let retry = ctx.attempts < max;
                ctx.pending = retry.then_some(attempt.target);
                e.set_retry(retry);
                return e;
            }
        }
        let retry = self.after_failure(ctx, outcome, Advance::NextDeployment);
        e.set_retry(retry);
        e
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
        if Self::committed(session, ctx) {
            // Mid-response failure: end an SSE stream with an error event, never [DONE]; the
            // connection then closes without the final chunk.
            if ctx.is_sse && !ctx.stream.done && e.esource() != &ErrorSource::Downstream {
                let event = sse_error_event(
                    "the provider's stream broke before it was complete",
                    "upstream_stream_interrupted",
                );
                let _ = session.write_response_body(Some(event), false).await;
            }
            ctx.stream_broken = true;
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let client_gone = e.esource() == &ErrorSource::Downstream
            && matches!(
                e.etype(),
                ErrorType::ReadError
                    | ErrorType::WriteError
                    | ErrorType::ConnectionClosed
                    | ErrorType::ReadTimedout
            );
        if client_gone {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let err = match (e.esource(), &ctx.plan) {
            (ErrorSource::Downstream, _) => {
                GatewayError::new(ErrorCode::InvalidRequest, "the request could not be read")
            }
            (_, Some(plan)) => ctx.failures.final_error(plan),
            (_, None) => GatewayError::new(
                ErrorCode::Internal,
                "the gateway could not handle the request",
            ),
        };
        let status = err.status;
        match respond::write_error(session, ctx, err).await {
            Ok(()) => FailToProxy {
                error_code: status,
                can_reuse_downstream: false,
            },
            Err(_) => FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            },
        }
    }

    async fn logging(&self, _session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX)
    where
        Self::CTX: Send + Sync,
    {
        if ctx.current.is_some() {
            // The attempt whose response was relayed (or that ended with the request).
            let empty = ctx.stream.empty_choices || (ctx.is_sse && ctx.stream.data_events == 0);
            let outcome = if ctx.served.is_some() && empty && !ctx.stream.upstream_error_event {
                Outcome::Empty
            } else if ctx.stream_broken && ctx.served.is_some() {
                Outcome::StreamBroken
            } else if e.is_some_and(|e| e.esource() == &ErrorSource::Downstream) {
                Outcome::Cancelled
            } else if matches!(ctx.rewriter, ResponseRewriter::Replace { .. }) {
                Outcome::ClientError
            } else if ctx.served.is_some() {
                Outcome::Ok
            } else {
                Outcome::Cancelled
            };
            ctx.finish_attempt(outcome);
        }
        if ctx.in_flight {
            self.state.metrics.in_flight.dec();
        }
        let Some(tables) = ctx.tables.as_ref() else {
            return;
        };
        let metrics = &tables.metrics;
        let none = tables.catalog.providers.len();
        let served_provider = ctx.served.map_or(none, |a| a.provider.get());
        let route = ctx.route.unwrap_or(tables.unresolved).get();
        metrics
            .requests
            .inc(&[route, served_provider, status_class_index(ctx.status)]);
        for rec in &ctx.log {
            let p = rec.provider.get();
            metrics.attempts.inc(&[p, rec.outcome.index()]);
            if rec.followed {
                metrics.failovers.inc(&[p, rec.outcome.index()]);
            }
            if let Some(pm) = metrics.providers.get(p) {
                if let Some(ttfb) = rec.ttfb {
                    pm.ttfb.observe(ttfb.as_secs_f64());
                    pm.latency.observe(rec.duration.as_secs_f64());
                }
            }
        }
        if tracing::enabled!(target: "access", tracing::Level::INFO) {
            let provider = ctx
                .served
                .map(|a| tables.catalog.provider(a.provider).id.clone());
            let route = tables.route(ctx.route.unwrap_or(tables.unresolved));
            let mut tried = String::new();
            for rec in &ctx.log {
                if !tried.is_empty() {
                    tried.push(',');
                }
                tried.push_str(&tables.catalog.provider(rec.provider).id);
                tried.push(':');
                tried.push_str(rec.outcome.as_str());
            }
            tracing::info!(
                target: "access",
                request_id = %ctx.request_id.to_str().unwrap_or(""),
                route = %route.label,
                provider = %provider.as_deref().unwrap_or("none"),
                status = ctx.status.unwrap_or(0),
                attempts = ctx.attempts,
                tried = %tried,
                error = %ctx.local_error.as_ref().map_or("-", |e| e.code.as_str()),
                stream_broken = ctx.stream_broken,
                ms = ctx.started.elapsed().as_secs_f64() * 1000.0,
            );
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Self::CTX, _error: &Error) -> bool {
        // Pingora's line would carry peer details; the access line above covers the request.
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

/// Log that the gateway ran out of a local resource, at most once a second (it happens in
/// bursts, under exactly the load where a log flood hurts most).
fn warn_local_resource() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Ordering::Relaxed) != now {
        tracing::warn!(
            "cannot open an upstream connection: the gateway is out of file descriptors, ports or memory (raise LimitNOFILE / ulimit -n); providers are not blamed"
        );
    }
}

/// A successful answer binds the caller's session (`x-llm-session`) to the deployment that
/// served it. Done when the header goes out, so the caller's next request already sees it.
fn bind_session(ctx: &RequestCtx) {
    let (Some(hash), Some(router), Some(tables), Some(plan), Some(served)) = (
        ctx.session,
        &ctx.router,
        &ctx.tables,
        &ctx.plan,
        &ctx.served,
    ) else {
        return;
    };
    if let Some(d) = plan.deployment(&tables.catalog, served.target.position) {
        if d.model.is_some() {
            router.sessions.put(hash, d.idx, router.health.now_ms());
        }
    }
}

fn starts_with_ignore_case(hay: &[u8], prefix: &[u8]) -> bool {
    hay.len() >= prefix.len() && hay[..prefix.len()].eq_ignore_ascii_case(prefix)
}
