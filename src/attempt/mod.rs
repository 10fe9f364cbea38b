//! The attempt engine's pure core: every attempt ends in one verdict, decided here for both
//! drivers.
//!
//! - [`outcome`]: the vocabulary — how an upstream call ended ([`Outcome`]), where the plan looks
//!   next ([`Advance`]), why no call was made ([`NoCall`]), transport errors classified, and
//!   what the caller is told when every attempt failed ([`FailureLog`]);
//! - [`verdict`]: from what the provider sent so far (connect error, header, body, the end of
//!   it) and the request's commit point, the attempt's [`Verdict`]: pending, commit, ended,
//!   retry (with its scope) or a refusal to relay;
//! - [`schedule`]: after a failure, whether another attempt runs and where (the same target
//!   after a backoff, the plan's next, none), under `max_attempts`, the deadline and the
//!   same-target retry rules.
//!
//! The room depends on nothing of the gateway's but its error type: what an answer showed is
//! described in its own words ([`Shown`]), which the relay's reading is turned into, so the
//! config layer can ask it which statuses are failures. Nothing here touches a socket, a
//! breaker or a counter: the proxy's drivers describe what
//! they saw, ask, and settle health, the ledger row, metrics and the access line from the
//! answer in one place (`proxy::settle`). No rule about what is retryable exists anywhere else.

pub mod outcome;
pub mod schedule;
pub mod verdict;

pub use outcome::{
    classify_connect_error, classify_proxy_error, is_local_resource_error, parse_retry_after,
    Advance, FailureLog, NoCall, Outcome,
};
pub use schedule::{Next, RetryOn, RetryRules, SameTarget, Spent, StatusSet};
pub use verdict::{
    judge, BodyEnd, CommitAt, ProviderError, Scope, Sent, Shown, Terms, Unreadable, Verdict,
};
