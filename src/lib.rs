//! signalbox: an LLM gateway on Pingora.
//!
//! Callers send OpenAI-shaped `POST /v1/chat/completions`; signalbox resolves the `model`
//! string to a route, walks the route's candidates (deployment × credential) and fails over
//! to the next one when an attempt fails before the caller received a byte.
//!
//! # The house
//!
//! Dependencies point one way: `config` → `catalog` → `health` → `routing` → `proxy` →
//! `server`, with `retry` (the failure vocabulary) and `adapters` (the dialects) below all of
//! them, and `server` the only module that sees every other.
//!
//! - [`config`]: the file format (`schema`), its checked types, per-section validation, value
//!   parsers, the one table of defaults, and the condition language of rules and policies.
//! - [`catalog`]: providers, credentials, models and deployments, ready for the request path,
//!   with the stable identities that survive a rebuild.
//! - [`retry`]: the failure vocabulary — how an attempt ended, where the plan looks next,
//!   what is retryable, what the caller is told.
//! - [`health`]: per-target, per-credential and per-deployment records (breakers, cooldowns,
//!   benching, EWMAs), carried across catalog rebuilds by identity; active probes.
//! - [`routing`]: deciding, purely — model resolution, the routing snapshot, policies and
//!   rules compiled into routes (`policy`), the precedence of what a request names and its
//!   plan (`decide`), strategies (`scoring`), per-request lead picks (`lead`), the plan walk
//!   (`plan`), the background ranker, and `explain`, which runs the same decision and walk.
//! - [`adapters`]: provider dialects as byte transforms (the JSON scanner, the OpenAI
//!   dialect).
//! - [`proxy`]: doing — the `ProxyHttp` implementation, one room per concern: intake,
//!   planning, the attempt, the response, the failure decision, accounting.
//! - [`metrics`], [`admin`]: Prometheus metrics (request and health families) and the admin
//!   listener.
//! - [`dns`]: background re-resolution of provider hosts; [`periodic`]: the loop background
//!   passes share.
//! - [`reload`]: a new config validated, built into a snapshot (health carried over) and
//!   swapped in, or refused with nothing changed; admin writes are written back to the file.
//! - [`server`]: the shared gateway state and the Pingora server assembled from a config.
//! - [`server_tls`]: the proxy listener's TLS certificate (loaded and checked; a leaf that
//!   config validation uses) in the store handshakes read, swapped on reload.
//!
//! The request lifecycle, hook by hook, is the table in [`proxy`]. The mock provider the
//! tests, demo and load tests run against is its own crate, `signalbox-mock`.

pub mod adapters;
pub mod admin;
pub mod catalog;
pub mod config;
pub mod dns;
pub mod error;
pub mod health;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod periodic;
pub mod proxy;
pub mod reload;
pub mod retry;
pub mod routing;
pub mod secret;
pub mod server;
pub mod server_tls;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
