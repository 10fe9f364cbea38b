//! The counters that limit use, lock-free and clock-free (every call takes the time): sliding
//! one-minute windows of requests or tokens ([`window`]) and spend over a calendar period
//! ([`budget`]). Client keys, deployments, providers and the whole gateway keep them; what a
//! limit is and who is refused is decided by their owners. [`provider`] reads a provider's own
//! rate-limit headers.

pub mod budget;
pub mod hold;
pub mod provider;
pub mod share;
pub mod window;
