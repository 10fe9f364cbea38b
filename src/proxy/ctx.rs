//! `RequestCtx`: everything one request carries through Pingora's hooks, typed by phase.
//!
//! - Fixed when the request arrives: its id, its start, the snapshot it runs on (one load, kept
//!   for the request's life, so a swap mid-request never changes the plan under it).
//! - Fixed by `request_filter` once the request is admitted and planned ([`Admitted`]): the
//!   caller's request, how it was routed, its plan, the rules its attempts run under and
//!   whether signalbox drives them itself. A request refused before that has none.
//! - The attempts ([`Attempts`]): the one in flight ([`Live`]), the next one's target, the
//!   record of every attempt made, and the answer's relay.
//! - The caller's side ([`Downstream`]): pending, committed (a header went out: no attempt may
//!   follow) or broken (a committed answer ended abnormally).
//!
//! `logging` reads it once at the end to emit metrics, the ledger rows and the access line:
//! nothing is counted anywhere else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;

use crate::adapters::caller::CallerRequest;
use crate::adapters::chat_messages::Unexpressible;
use crate::adapters::relay::Relay;
use crate::attempt::{FailureLog, Outcome, RetryRules, Spent, Terms};
use crate::catalog::surface::{Conversion, Surface};
use crate::catalog::ProviderIdx;
use crate::config::Hedge;
use crate::error::GatewayError;
use crate::health::{InflightGuard, ProbeClaim};
use crate::keys::Reservation;
use crate::limits::hold::Reserved;
use crate::routing::decide::Routed;
use crate::routing::lead::splitmix64;
use crate::routing::plan::{Plan, Target};
use crate::snapshot::Snapshot;

/// One request's context.
#[derive(Debug)]
pub struct RequestCtx {
    pub started: Instant,
    pub request_id: HeaderValue,
    /// The endpoint the caller called (the dialect of every answer).
    pub surface: Surface,
    /// The snapshot the request runs on.
    pub snapshot: Arc<Snapshot>,
    /// The caller's key (its index in the snapshot's key table), when keys are configured.
    pub key: Option<usize>,
    /// What the gateway and the caller's key must still admit (done with the first target).
    pub admission: RequestAdmission,
    /// What the key reserved for this request (settled when it ends).
    pub key_reservation: Option<Reservation>,
    /// The estimated cost exact admission reserved in the key's, its user's and the gateway's
    /// budgets (settled to the served answer's cost when it ends).
    pub reserved_cost: Option<Reserved>,
    /// Set once the request is admitted and planned.
    pub admitted: Option<Admitted>,
    pub downstream: Downstream,
    /// `x-llm-guardrails` for the answer: what the request's guardrails found (`proxy::guard`).
    pub guardrails: Option<HeaderValue>,
    /// An error signalbox answered itself.
    pub local_error: Option<GatewayError>,
    /// Counted in the in-flight gauge (released by `logging`).
    pub in_flight: bool,
    /// The gateway asking itself (`crate::internal`): no caller key needed, its scope not
    /// applied, no guardrail and no knn selection run.
    pub internal: bool,
    /// The caller sent some `x-llm-*` header: only then are the steering headers looked up
    /// (`proxy::headers::scan_caller`).
    pub steering: bool,
}

/// Admission of the request itself (the gateway's budget, the caller's key), which happens
/// once, with its first target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestAdmission {
    /// No gateway budget and no key: nothing to admit.
    Open,
    /// To be admitted, with the tokens the key's window counts for it.
    Pending {
        tokens: u64,
    },
    Done,
}

/// What exact shared admission counted for an attempt's deployment before the attempt
/// started (all of it in the shared store and here alike).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttemptHold {
    /// Its call, counted in the deployment's `rpm` window at this second.
    pub request_at: Option<u64>,
    /// Its estimated tokens, reserved in the deployment's `tpm` window.
    pub tokens: Option<Reserved>,
    /// Its estimated cost, reserved in the deployment's and its provider's budgets.
    pub cost: Option<Reserved>,
}

/// What `request_filter` fixes for an admitted request.
#[derive(Debug)]
pub struct Admitted {
    pub request: CallerRequest,
    /// How the request reached its route (model, policy entry, rule), and its overrides.
    pub routed: Routed,
    pub plan: Plan,
    /// The bounds on its attempts.
    pub rules: RetryRules,
    /// Where its answers commit, and whether refusals fail over.
    pub terms: Terms,
    /// Signalbox drives the attempts itself (its own driver), not Pingora's proxy loop.
    pub driven: bool,
    /// Hash of `x-llm-session`, when the caller sent one.
    pub session: Option<u64>,
    /// Seed of this request's random draws (retry jitter).
    pub seed: u64,
    /// Hedged first token for this request's route, when configured.
    pub hedge: Option<Hedge>,
    pub attempts: Attempts,
}

/// The attempts of one request.
#[derive(Debug)]
pub struct Attempts {
    /// Upstream calls made (`x-llm-attempts`).
    pub made: u32,
    pub first_at: Option<Instant>,
    /// Every attempt that ended, in order (most requests make one or two: no allocation).
    pub log: AttemptLog,
    /// How they failed, for the final answer.
    pub failures: FailureLog,
    /// Same-target retries spent on the current target, and the one fresh-connection call.
    pub same_target: u32,
    pub fresh: bool,
    /// The target of the next attempt (what starts it claimed, a wait before it).
    pub next: Option<NextTarget>,
    /// The attempt in flight.
    pub live: Option<Live>,
    /// The attempt whose answer is the caller's.
    pub served: Option<Served>,
    /// What the served attempt's admission holds (settled to its answer's usage at the end).
    pub served_hold: AttemptHold,
    /// The current (or last) attempt's response body on its way to the caller.
    pub relay: Relay,
    /// The current attempt's answer is a stream.
    pub sse: bool,
    /// How the current attempt's provider serves the caller's surface.
    pub conversion: Conversion,
    /// The body for the current attempt, and what it was built for.
    pub body: Option<AttemptBody>,
    /// A candidate skipped because its dialect cannot express a field of the request: the
    /// caller's 400 if no candidate serves.
    pub unexpressible: Option<Unexpressible>,
    /// The hedge this request ran (at most one).
    pub hedge: Option<HedgeRun>,
}

/// A hedge a request ran: how long its first attempt had waited, and (once an answer
/// committed) whether the hedge served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HedgeRun {
    pub after: Duration,
    /// `Some(true)`: the hedge served (`x-llm-hedged: won`); `Some(false)`: the first attempt
    /// did; `None`: neither (both failed, or the caller left).
    pub won: Option<bool>,
}

/// What one attempt owns while another runs beside it (a hedge). The attempt whose event is
/// being handled has its lane swapped into [`Attempts`] ([`Attempts::swap_lane`]), so
/// settling, the relay and the request rewrite see the attempt they concern.
#[derive(Debug)]
pub struct Lane {
    live: Option<Live>,
    relay: Relay,
    sse: bool,
    conversion: Conversion,
    body: Option<AttemptBody>,
}

impl Lane {
    /// A lane for an attempt not yet begun; `body` is kept for reuse when its target takes
    /// the same one.
    pub fn new(body: Option<AttemptBody>) -> Self {
        Self {
            live: None,
            relay: Relay::passthrough(),
            sse: false,
            conversion: Conversion::Same,
            body,
        }
    }

    /// The attempt of this lane is over (settled).
    pub fn is_idle(&self) -> bool {
        self.live.is_none()
    }
}

impl Attempts {
    pub fn new(next: Option<NextTarget>) -> Self {
        Self {
            made: 0,
            first_at: None,
            log: AttemptLog::new(),
            failures: FailureLog::default(),
            same_target: 0,
            fresh: false,
            next,
            live: None,
            served: None,
            served_hold: AttemptHold::default(),
            relay: Relay::passthrough(),
            sse: false,
            conversion: Conversion::Same,
            body: None,
            unexpressible: None,
            hedge: None,
        }
    }

    /// Exchange the attempt in these fields with the one in `lane`.
    pub fn swap_lane(&mut self, lane: &mut Lane) {
        std::mem::swap(&mut self.live, &mut lane.live);
        std::mem::swap(&mut self.relay, &mut lane.relay);
        std::mem::swap(&mut self.sse, &mut lane.sse);
        std::mem::swap(&mut self.conversion, &mut lane.conversion);
        std::mem::swap(&mut self.body, &mut lane.body);
    }

    /// What the schedule reads.
    pub fn spent(&self) -> Spent {
        Spent {
            attempts: self.made,
            same_target: self.same_target,
            fresh: self.fresh,
        }
    }
}

/// The target of the next attempt.
#[derive(Debug)]
pub struct NextTarget {
    pub target: Target,
    /// The half-open probe slot this attempt holds (given back if it never starts).
    pub claim: Option<ProbeClaim>,
    /// Wait this long before calling (a same-target retry's backoff).
    pub delay: Duration,
    /// Set once the target is admitted against the shared limits (see `proxy::admission`).
    pub hold: Option<AttemptHold>,
}

/// The attempt in flight.
#[derive(Debug)]
pub struct Live {
    pub target: Target,
    pub provider: ProviderIdx,
    pub started: Instant,
    /// When the response header arrived, and its status.
    pub header_at: Option<Instant>,
    pub status: Option<u16>,
    /// Its in-flight count (and probe slot) in the health registry.
    pub guard: InflightGuard,
    /// The provider's `Retry-After` on a failure status, capped.
    pub retry_after: Option<Duration>,
    /// What its admission counted in the shared limits.
    pub hold: AttemptHold,
}

/// The attempt whose answer is the caller's.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub target: Target,
    pub provider: ProviderIdx,
    pub started: Instant,
    pub header_at: Option<Instant>,
}

/// The attempts a request made, the first two inline.
pub type AttemptLog = smallvec::SmallVec<[AttemptRecord; 2]>;

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
    /// again — a fresh connection, a same-target retry — is not one).
    pub followed: bool,
}

/// One attempt's request body.
#[derive(Debug, Clone)]
pub struct AttemptBody {
    pub upstream_model: Bytes,
    pub conversion: Conversion,
    pub bytes: Bytes,
}

/// The caller's side of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Downstream {
    /// Nothing final written yet: another attempt may run.
    #[default]
    Pending,
    /// A response header went out with this status: no attempt may follow.
    Committed { status: u16 },
    /// A committed answer ended abnormally (the caller got an error event, or the connection
    /// was cut).
    Broken { status: u16, reason: Broke },
}

/// Why a committed answer ended abnormally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broke {
    /// The provider's stream broke or ended without its terminal event.
    Interrupted,
    /// No chunk within `failover.stream_idle_timeout`.
    Stalled,
}

impl Downstream {
    pub fn is_committed(self) -> bool {
        self != Downstream::Pending
    }

    /// The status the caller got.
    pub fn status(self) -> Option<u16> {
        match self {
            Downstream::Pending => None,
            Downstream::Committed { status } | Downstream::Broken { status, .. } => Some(status),
        }
    }

    /// The committed answer ended abnormally.
    pub fn break_with(&mut self, reason: Broke) {
        if let Downstream::Committed { status } = *self {
            *self = Downstream::Broken { status, reason };
        }
    }

    pub fn is_broken(self) -> bool {
        matches!(self, Downstream::Broken { .. })
    }
}

impl RequestCtx {
    pub fn new(snapshot: Arc<Snapshot>) -> Self {
        Self {
            started: Instant::now(),
            request_id: next_request_id(),
            surface: Surface::ChatCompletions,
            snapshot,
            key: None,
            admission: RequestAdmission::Open,
            key_reservation: None,
            reserved_cost: None,
            admitted: None,
            downstream: Downstream::Pending,
            guardrails: None,
            local_error: None,
            in_flight: false,
            internal: false,
            steering: false,
        }
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

    #[test]
    fn the_callers_side_goes_one_way() {
        let mut d = Downstream::Pending;
        d.break_with(Broke::Stalled);
        assert_eq!(d, Downstream::Pending, "nothing to break before a commit");
        d = Downstream::Committed { status: 200 };
        d.break_with(Broke::Stalled);
        assert_eq!(
            d,
            Downstream::Broken {
                status: 200,
                reason: Broke::Stalled
            }
        );
        assert_eq!(d.status(), Some(200));
        assert!(d.is_committed() && d.is_broken());
    }
}
