//! `RequestCtx`: everything one request carries through Pingora's hooks.
//!
//! One typed context, filled in order by the phases (see `proxy::mod`): the snapshot and plan
//! from `request_filter`, the current attempt from `upstream_peer`, outcomes from the failure
//! hooks, the response handling from the response filters. `logging` reads it once at the end
//! to emit metrics and the access line: nothing is counted anywhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;

use crate::adapters::caller::CallerRequest;
use crate::adapters::chat_messages::Unexpressible;
use crate::adapters::relay::Relay;
use crate::catalog::surface::{Conversion, Surface};
use crate::catalog::ProviderIdx;
use crate::error::GatewayError;
use crate::health::{InflightGuard, Observation};
use crate::keys::Reservation;
use crate::retry::{Advance, FailureLog, Outcome};
use crate::routing::decide::Routed;
use crate::routing::lead::splitmix64;
use crate::routing::plan::{Plan, Target};
use crate::routing::{RouteIdx, Router, Tables};

/// One upstream call.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub target: Target,
    pub provider: ProviderIdx,
    pub started: Instant,
    /// When the response header arrived, and its status.
    pub header_at: Option<Instant>,
    pub status: Option<u16>,
}

/// An attempt as the log and metrics see it once it ended.
#[derive(Debug, Clone, Copy)]
pub struct AttemptRecord {
    pub provider: ProviderIdx,
    /// Plan position and credential called.
    pub target: (usize, usize),
    pub outcome: Outcome,
    /// The upstream's status, when a response header arrived.
    pub status: Option<u16>,
    pub started: Instant,
    pub ttfb: Option<Duration>,
    pub duration: Duration,
    /// Whether an attempt on another target followed (a failover; calling the same target
    /// again — a stale pooled connection, a transient retry — is not one).
    pub followed: bool,
}

/// Why a committed stream was ended by signalbox (the event the caller gets says so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortReason {
    /// No chunk within `failover.stream_idle_timeout` (the hold path).
    Stalled,
}

/// One attempt's request body.
#[derive(Debug, Clone)]
pub struct AttemptBody {
    pub upstream_model: Bytes,
    pub conversion: Conversion,
    pub bytes: Bytes,
}

#[derive(Debug)]
pub struct RequestCtx {
    pub started: Instant,
    /// The endpoint the caller called.
    pub surface: Surface,
    pub request_id: HeaderValue,
    pub router: Option<Arc<Router>>,
    pub tables: Option<Arc<Tables>>,
    pub route: Option<RouteIdx>,
    /// How the request reached its route (model, policy entry, rule), and its overrides.
    pub routed: Option<Routed>,
    /// Upstream calls this request may make (a policy's `max_attempts`, else the config's).
    pub max_attempts: u32,
    /// A provider's 400 moves on to the next candidate (the policy says so).
    pub failover_on_client_error: bool,
    /// The current attempt's refusal is being read to decide whether it fails over.
    pub client_error_pending: bool,
    /// After a context-length refusal: the next candidate's context window must exceed this.
    pub context_floor: Option<u64>,
    pub request: Option<CallerRequest>,
    /// The caller's key (its index in the snapshot's key table), when keys are configured.
    pub key: Option<usize>,
    /// What the key reserved for this request (settled when it ends).
    pub key_reservation: Option<Reservation>,
    /// Some candidate of the plan speaks the other dialect (its answers are translated: the
    /// request takes the hold path, which can read a whole answer before committing it).
    pub translates: bool,
    /// How the current attempt's provider serves the caller's surface.
    pub conversion: Conversion,
    /// A candidate skipped because its dialect cannot express a field of the request: the
    /// caller's 400 if no candidate serves.
    pub unexpressible: Option<Unexpressible>,
    pub plan: Option<Plan>,
    /// The target the next `upstream_peer` call connects to.
    pub pending: Option<Target>,
    /// A target to call again because its pooled connection was stale (not a failover).
    pub retry_same: bool,
    /// Same-target retries spent on the current target (`failover.transient_retries`).
    pub transient_retries: u32,
    pub current: Option<Attempt>,
    /// Holds the current attempt's in-flight count (and probe slot) in the health registry.
    pub guard: Option<InflightGuard>,
    /// The provider's `Retry-After` on the current attempt's failure status, clamped.
    pub retry_after: Option<Duration>,
    /// Hash of `x-llm-session`, when the caller sent one.
    pub session: Option<u64>,
    /// Upstream calls made (`x-llm-attempts`).
    pub attempts: u32,
    pub first_attempt_at: Option<Instant>,
    /// An outcome already known for the current attempt (a status classified in
    /// `upstream_response_filter`), consumed by the failure hook.
    pub status_outcome: Option<(Outcome, Advance)>,
    pub failures: FailureLog,
    pub log: Vec<AttemptRecord>,
    /// The attempt whose response is being relayed.
    pub served: Option<Attempt>,
    /// A response header (not 1xx) went to the client: no attempt may follow.
    pub committed: bool,
    /// Status sent to the client.
    pub status: Option<u16>,
    /// The current attempt's response body on its way to the caller, and what it showed.
    pub relay: Relay,
    pub is_sse: bool,
    /// The body for the current attempt, and the upstream model literal and conversion it was
    /// built for.
    pub attempt_body: Option<AttemptBody>,
    /// An error signalbox answered itself.
    pub local_error: Option<GatewayError>,
    pub stream_broken: bool,
    /// Why signalbox itself ended a committed stream (the hold path's idle timeout).
    pub abort_reason: Option<AbortReason>,
    pub in_flight: bool,
}

impl RequestCtx {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            surface: Surface::ChatCompletions,
            request_id: next_request_id(),
            router: None,
            tables: None,
            route: None,
            routed: None,
            max_attempts: u32::MAX,
            failover_on_client_error: false,
            client_error_pending: false,
            context_floor: None,
            request: None,
            key: None,
            key_reservation: None,
            translates: false,
            conversion: Conversion::Same,
            unexpressible: None,
            plan: None,
            pending: None,
            retry_same: false,
            transient_retries: 0,
            current: None,
            guard: None,
            retry_after: None,
            session: None,
            attempts: 0,
            first_attempt_at: None,
            status_outcome: None,
            failures: FailureLog::default(),
            log: Vec::new(),
            served: None,
            committed: false,
            status: None,
            relay: Relay::passthrough(),
            is_sse: false,
            attempt_body: None,
            local_error: None,
            stream_broken: false,
            abort_reason: None,
            in_flight: false,
        }
    }

    /// Close the current attempt with an outcome: log it and record it in the health registry.
    pub fn finish_attempt(&mut self, outcome: Outcome) {
        self.close_attempt(outcome, true);
    }

    /// Close the current attempt without judging the target (a stale pooled connection the
    /// upstream had closed: not the target's failure).
    pub fn abandon_attempt(&mut self, outcome: Outcome) {
        self.close_attempt(outcome, false);
    }

    fn close_attempt(&mut self, outcome: Outcome, judge: bool) {
        let retry_after = self.retry_after.take();
        if let Some(a) = self.current.take() {
            let now = Instant::now();
            let target = (a.target.position, a.target.credential);
            if let Some(prev) = self.log.last_mut() {
                prev.followed = prev.target != target;
            }
            let ttfb = a.header_at.map(|h| h.duration_since(a.started));
            let duration = now.duration_since(a.started);
            self.log.push(AttemptRecord {
                provider: a.provider,
                target,
                outcome,
                status: a.status,
                started: a.started,
                ttfb,
                duration,
                followed: false,
            });
            let guard = self.guard.take();
            if let (Some(guard), true) = (guard, judge) {
                guard.finish(Observation {
                    outcome,
                    ttfb,
                    latency: (outcome == Outcome::Ok).then_some(duration),
                    output_tokens: self.relay.signals().usage.map(|u| u.completion_tokens),
                    retry_after,
                    probe: false,
                });
            }
        }
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}

/// Request ids: 32 hex characters, unique per process (a random 64-bit prefix per process and a
/// bijective mix of a counter), so ids from replicas do not collide in practice.
fn next_request_id() -> HeaderValue {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(process_seed);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mixed = splitmix64(n ^ prefix.rotate_left(17));
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&prefix.to_be_bytes());
    raw[8..].copy_from_slice(&mixed.to_be_bytes());
    let mut buf = [0u8; 32];
    // Cannot fail: the output is exactly twice the input.
    let _ = hex::encode_to_slice(raw, &mut buf);
    HeaderValue::from_bytes(&buf).unwrap_or_else(|_| HeaderValue::from_static("0"))
}

fn process_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS; mix in time and pid for good measure.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_unique_hex() {
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| next_request_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in ids.iter().take(3) {
            let s = id.to_str().expect("ascii");
            assert_eq!(s.len(), 32);
            assert!(s.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }
}
