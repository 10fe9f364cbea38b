//! One attempt's request: turning the next target into a connection and a request for it,
//! the same for both drivers.
//!
//! [`begin`] starts the attempt (the peer on a pre-resolved address, the in-flight count and
//! the probe slot in health); [`prepare_body`] builds the body for the target's upstream model
//! and dialect; the request header is rewritten for the target (only what
//! [`super::headers::to_provider_from`] allows of the caller's, then the provider's own `headers`,
//! its credential, `Host` and path from its base URL); and on the fast path the body
//! Pingora replays from its retry buffer is swapped for the whole rewritten body.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType};
use pingora_http::RequestHeader;

use super::ctx::{Admitted, AttemptBody, Live, RequestCtx};
use super::respond;
use crate::adapters::anthropic::ANTHROPIC_VERSION;
use crate::adapters::chat_messages::Unexpressible;
use crate::adapters::relay::Relay;
use crate::catalog::surface::{Conversion, Dialect, Surface};
use crate::config::ProviderKind;
use crate::health::TargetRef;
use crate::snapshot::Snapshot;

const ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");
/// [`ANTHROPIC_VERSION_HEADER`], to borrow.
static ANTHROPIC_VERSION_NAME: HeaderName = ANTHROPIC_VERSION_HEADER;

fn internal(why: &'static str) -> Box<Error> {
    Error::explain(ErrorType::InternalError, why)
}

/// Start the next attempt: its peer (a pre-resolved address, TLS/SNI, timeouts), its health
/// bookkeeping (the in-flight count, the probe slot it holds), its count. The target must
/// have been admitted (`admission::admit_next`) and the body prepared for it
/// ([`prepare_body`]).
pub fn begin(snapshot: &Snapshot, a: &mut Admitted) -> pingora_error::Result<Arc<HttpPeer>> {
    let next = a
        .attempts
        .next
        .take()
        .ok_or_else(|| internal("no target left"))?;
    let target = next.target;
    let hold = next.hold.unwrap_or_default();
    let deployment = a
        .plan
        .deployment(&snapshot.catalog, target.position)
        .ok_or_else(|| internal("target has no deployment"))?;
    let provider = deployment.provider;
    let peer = snapshot
        .catalog
        .provider(provider)
        .peer()
        .ok_or_else(|| internal("target has no address"))?;
    let health_ref = TargetRef {
        deployment: deployment.model.map(|_| deployment.idx),
        provider,
        credential: target.credential,
    };
    let now = Instant::now();
    let at = &mut a.attempts;
    at.first_at.get_or_insert(now);
    at.made += 1;
    at.live = Some(Live {
        target,
        provider,
        started: now,
        header_at: None,
        status: None,
        guard: snapshot.health.begin(health_ref, next.claim),
        retry_after: None,
        hold,
    });
    if hold.request_at.is_none() {
        // The deployment's request window (its `rpm`, its headroom), counted per call made
        // (exact shared admission already counted it).
        deployment.requests.add(snapshot.health.shared.wall_s(), 1);
    }
    // What an earlier attempt's response set up does not carry over.
    at.relay = Relay::passthrough();
    at.sse = false;
    Ok(peer)
}

/// The body the next target gets, in its dialect: rebuilt only when the upstream model or the
/// conversion changes. A target whose dialect cannot express the request is refused with the
/// field it cannot carry.
pub fn prepare_body(
    snapshot: &Snapshot,
    surface: Surface,
    a: &mut Admitted,
) -> Result<(), Unexpressible> {
    let Some(next) = &a.attempts.next else {
        return Ok(());
    };
    let Some(deployment) = a.plan.deployment(&snapshot.catalog, next.target.position) else {
        return Ok(());
    };
    let kind = snapshot.catalog.provider(deployment.provider).kind;
    let conversion = surface.served_by(kind).unwrap_or(Conversion::Same);
    let reuse = a.attempts.body.as_ref().is_some_and(|b| {
        b.conversion == conversion && b.upstream_model == deployment.upstream_model_json
    });
    if !reuse {
        let bytes = a.request.body_for(
            surface,
            conversion,
            &deployment.upstream_model,
            &deployment.upstream_model_json,
        )?;
        a.attempts.body = Some(AttemptBody {
            upstream_model: deployment.upstream_model_json.clone(),
            conversion,
            bytes,
        });
    }
    a.attempts.conversion = conversion;
    Ok(())
}

/// Most header fields the gateway sets that may share a name with another (its version, the
/// provider's own, the credential); a provider with more `headers` has its request built as a
/// map only ([`HeaderPlan::head`] declines).
const MAX_SET: usize = 16;

/// What the live attempt's upstream request header is made of, before it is built: the
/// caller's fields that may reach this provider (in their order), then the fields the gateway
/// sets, each replacing a caller's of the same name in place. Built either as Pingora's
/// [`RequestHeader`] ([`HeaderPlan::header`]) or, for the driven path's one-write send,
/// straight into the bytes Pingora would write for it ([`HeaderPlan::head`]).
pub struct HeaderPlan<'a> {
    method: &'a http::Method,
    uri: &'a http::Uri,
    version: http::Version,
    caller: &'a HeaderMap,
    kind: ProviderKind,
    /// Whether the caller's `anthropic-beta` travels (an Anthropic caller, same dialect).
    same_dialect: bool,
    pass: &'a crate::config::HeaderGlobs,
    provider_headers: &'a [(HeaderName, HeaderValue)],
    auth: Option<(&'a HeaderName, &'a HeaderValue)>,
    host: &'a HeaderValue,
    length: usize,
    request_id: &'a HeaderValue,
}

/// The plan of the live attempt's upstream request header (see [`HeaderPlan`]).
pub fn header_plan<'a>(
    ctx: &'a RequestCtx,
    caller: &'a RequestHeader,
) -> pingora_error::Result<HeaderPlan<'a>> {
    let snapshot = &ctx.snapshot;
    let Some(a) = &ctx.admitted else {
        return Err(internal("no attempt in progress"));
    };
    let live = a
        .attempts
        .live
        .as_ref()
        .ok_or_else(|| internal("no attempt in progress"))?;
    let deployment = a
        .plan
        .deployment(&snapshot.catalog, live.target.position)
        .ok_or_else(|| internal("no deployment"))?;
    let provider = snapshot.catalog.provider(deployment.provider);
    let auth = provider
        .credentials
        .get(live.target.credential)
        .and_then(|c| c.auth.as_ref())
        .map(|auth| (auth.header_name(), auth.header_value()));
    let surface = ctx.surface;
    Ok(HeaderPlan {
        method: &caller.method,
        uri: provider.uri(surface.endpoint(provider.kind)),
        version: caller.version,
        caller: &caller.headers,
        kind: provider.kind,
        // The caller's own version and betas pass on a same-dialect call; a translated
        // request is written for the version signalbox speaks.
        same_dialect: surface.dialect() == Dialect::Anthropic,
        pass: &snapshot.request.pass_headers,
        provider_headers: &provider.headers,
        auth,
        host: &provider.host_header,
        length: a.attempts.body.as_ref().map_or(0, |b| b.bytes.len()),
        request_id: &ctx.request_id,
    })
}

impl HeaderPlan<'_> {
    /// The fields the gateway sets that a caller's or another of its own may share a name
    /// with, in the order it sets them (a later one of the same name replaces an earlier one,
    /// in its place): its version, unless the caller's own travels (same dialect), the
    /// provider's `headers`, the credential. The gateway's last three (host, length, request
    /// id) are not among them: see [`Self::head`].
    fn own_fields(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        static VERSION: HeaderValue = HeaderValue::from_static(ANTHROPIC_VERSION);
        let version = (self.kind == ProviderKind::Anthropic
            && (!self.same_dialect || !self.caller.contains_key(ANTHROPIC_VERSION_HEADER)))
        .then_some((&ANTHROPIC_VERSION_NAME, &VERSION));
        version
            .into_iter()
            .chain(
                self.provider_headers
                    .iter()
                    .map(|(name, value)| (name, value)),
            )
            .chain(self.auth)
    }

    /// [`Self::own_fields`] in an array on the stack; `None` past [`MAX_SET`].
    #[allow(clippy::type_complexity)]
    fn set_fields(&self) -> Option<([(&HeaderName, &HeaderValue); MAX_SET], usize)> {
        static NO_NAME: HeaderName = header::HOST;
        static NO_VALUE: HeaderValue = HeaderValue::from_static("");
        let mut set = [(&NO_NAME, &NO_VALUE); MAX_SET];
        let mut n = 0;
        for field in self.own_fields() {
            *set.get_mut(n)? = field;
            n += 1;
        }
        Some((set, n))
    }

    /// Whether a caller's field named `name` reaches the provider.
    fn keeps(&self, name: &HeaderName) -> bool {
        super::headers::for_provider(name, self.kind, self.same_dialect, self.pass)
    }

    /// Pingora's request header: the caller's kept fields appended, the gateway's inserted.
    pub fn header(&self) -> RequestHeader {
        let length = super::headers::int_value(self.length);
        let mut headers =
            HeaderMap::with_capacity(self.caller.len() + self.provider_headers.len() + 6);
        super::headers::to_provider_from(
            self.caller,
            &mut headers,
            self.kind,
            self.same_dialect,
            self.pass,
        );
        for (name, value) in self.own_fields() {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(header::HOST, self.host.clone());
        headers.insert(header::CONTENT_LENGTH, length);
        headers.insert(respond::names::X_REQUEST_ID, self.request_id.clone());
        let mut parts = http::Request::new(()).into_parts().0;
        parts.method = self.method.clone();
        parts.uri = self.uri.clone();
        parts.version = self.version;
        parts.headers = headers;
        RequestHeader::from(parts)
    }

    /// The HTTP/1.1 head Pingora's `http_req_header_to_wire` would write for
    /// [`Self::header`] with its version set to 1.1, byte for byte, written straight from the
    /// caller's fields and the gateway's: no map is built (its hashing and inserts were a
    /// third of the driven path's header work, issue 22). `None` when the plan is not of the
    /// common shape (more provider fields than it has room for, a gateway-written name among
    /// them, a target with a byte Pingora refuses): build [`Self::header`] instead.
    pub fn head(&self) -> Option<bytes::BytesMut> {
        let (set, n) = self.set_fields()?;
        let set = &set[..n];
        // Host, length and request id are gateway-written: a caller's is never kept
        // (`headers::for_provider`) and a provider's `headers` cannot name one (config
        // validation), so they come last, once each, as the map has them. A plan that breaks
        // that (a credential sent in one of them) is built as a map.
        let tail = [
            &header::HOST,
            &header::CONTENT_LENGTH,
            &respond::names::X_REQUEST_ID,
        ];
        if set.iter().any(|(name, _)| tail.contains(name)) {
            return None;
        }
        let path = self.uri.path_and_query()?.as_str();
        if path.bytes().any(|b| matches!(b, b' ' | b'\r' | b'\n' | 0)) {
            return None;
        }
        let mut buf = bytes::BytesMut::with_capacity(512);
        buf.extend_from_slice(self.method.as_str().as_bytes());
        buf.extend_from_slice(b" ");
        buf.extend_from_slice(path.as_bytes());
        buf.extend_from_slice(b" HTTP/1.1\r\n");
        // The caller's kept fields, in the map's order (a name's values together, where it
        // first came). A name the gateway sets gets the gateway's last value in its place.
        let mut replaced = 0u32;
        let mut previous: Option<&HeaderName> = None;
        for (name, value) in self.caller {
            let same = previous == Some(name);
            previous = Some(name);
            if !self.keeps(name) {
                continue;
            }
            match last_set(set, name) {
                Some(i) => {
                    if !same {
                        replaced |= mark(set, name);
                        wire_field(&mut buf, name, set[i].1);
                    }
                }
                None => wire_field(&mut buf, name, value),
            }
        }
        // Then the gateway's own, each name once (where first set, with its last value).
        for (i, (name, _)) in set.iter().enumerate() {
            if replaced & (1 << i) != 0 || set[..i].iter().any(|(earlier, _)| earlier == name) {
                continue;
            }
            if let Some(last) = last_set(set, name) {
                wire_field(&mut buf, name, set[last].1);
            }
        }
        wire_field(&mut buf, &header::HOST, self.host);
        wire_field(
            &mut buf,
            &header::CONTENT_LENGTH,
            &super::headers::int_value(self.length),
        );
        wire_field(&mut buf, &respond::names::X_REQUEST_ID, self.request_id);
        buf.extend_from_slice(b"\r\n");
        Some(buf)
    }
}

/// The position of the last field in `set` named `name`.
fn last_set(set: &[(&HeaderName, &HeaderValue)], name: &HeaderName) -> Option<usize> {
    set.iter().rposition(|(n, _)| *n == name)
}

/// The bits of `set`'s fields named `name`.
fn mark(set: &[(&HeaderName, &HeaderValue)], name: &HeaderName) -> u32 {
    set.iter()
        .enumerate()
        .filter(|(_, (n, _))| *n == name)
        .fold(0, |bits, (i, _)| bits | 1 << i)
}

/// One `name: value` line as Pingora writes it for a map without case: the standard names it
/// titles (pingora-http `case_header_name::titled_header_name_str`), the rest as they are.
fn wire_field(buf: &mut bytes::BytesMut, name: &HeaderName, value: &HeaderValue) {
    let titled = match *name {
        header::ACCEPT_RANGES => "Accept-Ranges",
        header::AGE => "Age",
        header::CACHE_CONTROL => "Cache-Control",
        header::CONNECTION => "Connection",
        header::CONTENT_TYPE => "Content-Type",
        header::CONTENT_ENCODING => "Content-Encoding",
        header::CONTENT_LENGTH => "Content-Length",
        header::DATE => "Date",
        header::TRANSFER_ENCODING => "Transfer-Encoding",
        header::HOST => "Host",
        header::SERVER => "Server",
        header::SET_COOKIE => "Set-Cookie",
        _ => name.as_str(),
    };
    buf.extend_from_slice(titled.as_bytes());
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value.as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// The live attempt's upstream request header, built for its target from the caller's.
pub fn upstream_request_header(
    ctx: &RequestCtx,
    caller: &RequestHeader,
) -> pingora_error::Result<RequestHeader> {
    Ok(header_plan(ctx, caller)?.header())
}

/// [`upstream_request_header`] in place of Pingora's copy of the caller's header (the fast
/// path's `upstream_request_filter`).
pub fn rewrite_request_header(
    ctx: &RequestCtx,
    upstream_request: &mut RequestHeader,
) -> pingora_error::Result<()> {
    *upstream_request = upstream_request_header(ctx, upstream_request)?;
    Ok(())
}

/// Pingora hands over its retry-buffer tail (or nothing) once per attempt, with
/// `end_of_stream`: replace it with the whole rewritten body.
pub fn swap_body(ctx: &RequestCtx, body: &mut Option<Bytes>, end_of_stream: bool) {
    *body = if end_of_stream {
        ctx.admitted
            .as_ref()
            .and_then(|a| a.attempts.body.as_ref())
            .map(|b| b.bytes.clone())
    } else {
        None
    };
}

#[cfg(test)]
mod tests {
    use pingora_core::protocols::http::v1::client::http_req_header_to_wire;
    use proptest::prelude::*;

    use super::*;
    use crate::config::HeaderGlobs;

    const NAMES: [&str; 12] = [
        "content-type",
        "accept",
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "x-custom-a",
        "x-custom-b",
        "authorization",
        "host",
        "x-request-id",
        "x-llm-route",
        "user-agent",
    ];

    /// Both ways of building the plan's request agree on the bytes Pingora would write.
    fn agree(plan: &HeaderPlan<'_>) -> Result<(), TestCaseError> {
        let mut header = plan.header();
        header.set_version(http::Version::HTTP_11);
        let expected = http_req_header_to_wire(&header).expect("a writable target");
        let head = plan.head().expect("the common shape");
        prop_assert_eq!(
            String::from_utf8_lossy(&head),
            String::from_utf8_lossy(&expected)
        );
        Ok(())
    }

    fn field() -> impl Strategy<Value = (HeaderName, HeaderValue)> {
        (prop::sample::select(NAMES.to_vec()), "[a-z0-9 ]{0,6}").prop_map(|(n, v)| {
            (
                HeaderName::from_static(n),
                HeaderValue::from_str(&v).expect("visible ASCII"),
            )
        })
    }

    proptest! {
        #[test]
        fn the_written_head_is_the_one_pingora_writes_for_the_header(
            caller_fields in prop::collection::vec(field(), 0..10),
            provider_fields in prop::collection::vec(field(), 0..4),
            auth_name in prop::sample::select(vec!["authorization", "x-api-key", "x-custom-a"]),
            with_auth: bool,
            anthropic: bool,
            same_dialect: bool,
            pass_custom: bool,
            length in 0usize..100_000,
        ) {
            let mut caller = HeaderMap::new();
            for (name, value) in caller_fields {
                caller.append(name, value);
            }
            // A provider's `headers` are a map (one value per name) that config validation
            // keeps clear of credentials and of the fields the gateway writes.
            let mut provider_headers: Vec<(HeaderName, HeaderValue)> = Vec::new();
            for (name, value) in provider_fields {
                let refused = crate::config::CREDENTIAL_HEADERS.contains(&name.as_str())
                    || crate::config::GATEWAY_WRITTEN_HEADERS.contains(&name.as_str());
                if !refused && !provider_headers.iter().any(|(n, _)| *n == name) {
                    provider_headers.push((name, value));
                }
            }
            let pass = HeaderGlobs(if pass_custom {
                vec!["x-custom-*".into(), "user-agent".into()]
            } else {
                Vec::new()
            });
            let auth_value = HeaderValue::from_static("Bearer sk-test");
            let auth_name = HeaderName::from_static(auth_name);
            let method = http::Method::POST;
            let uri: http::Uri = "/v1/chat/completions".parse().expect("uri");
            let host = HeaderValue::from_static("api.example.test");
            let request_id = HeaderValue::from_static("req-1");
            let plan = HeaderPlan {
                method: &method,
                uri: &uri,
                version: http::Version::HTTP_2,
                caller: &caller,
                kind: if anthropic { ProviderKind::Anthropic } else { ProviderKind::OpenAi },
                same_dialect,
                pass: &pass,
                provider_headers: &provider_headers,
                auth: with_auth.then_some((&auth_name, &auth_value)),
                host: &host,
                length,
                request_id: &request_id,
            };
            agree(&plan)?;
        }
    }

    #[test]
    fn a_plan_past_its_room_or_naming_a_gateway_field_is_built_as_a_header() {
        let caller = HeaderMap::new();
        let pass = HeaderGlobs(Vec::new());
        let many: Vec<(HeaderName, HeaderValue)> = (0..=MAX_SET)
            .map(|i| {
                (
                    HeaderName::from_bytes(format!("x-p{i}").as_bytes()).expect("name"),
                    HeaderValue::from_static("v"),
                )
            })
            .collect();
        let method = http::Method::POST;
        let uri: http::Uri = "/v1/chat/completions".parse().expect("uri");
        let value = HeaderValue::from_static("x");
        let plan = HeaderPlan {
            method: &method,
            uri: &uri,
            version: http::Version::HTTP_11,
            caller: &caller,
            kind: ProviderKind::OpenAi,
            same_dialect: false,
            pass: &pass,
            provider_headers: &many,
            auth: None,
            host: &value,
            length: 1,
            request_id: &value,
        };
        assert!(plan.head().is_none(), "more fields than MAX_SET");
        let host = [(header::HOST, HeaderValue::from_static("h"))];
        let plan = HeaderPlan {
            provider_headers: &host,
            ..plan
        };
        assert!(
            plan.head().is_none(),
            "a gateway-written field among the provider's"
        );
        let plan = HeaderPlan {
            provider_headers: &many[..2],
            ..plan
        };
        let head = plan.head().expect("room enough");
        assert!(head.starts_with(b"POST /v1/chat/completions HTTP/1.1\r\nx-p0: v\r\nx-p1: v\r\nHost: x\r\nContent-Length: 1\r\nx-request-id: x\r\n\r\n"));
    }
}
