//! signalbox: an LLM gateway on Pingora.
//!
//! Callers send OpenAI- or Anthropic-shaped requests; signalbox resolves the `model` string to
//! a route, walks the route's candidates (deployment × credential), translating between the
//! dialects where the provider speaks the other one, and fails over to the next candidate when
//! an attempt fails before the caller received a byte.
//!
//! # The house
//!
//! Dependencies point one way: `config` → `catalog` → `health` → `routing` → `proxy` →
//! `server`, with `attempt` (the attempt engine's pure core), `adapters` (the dialects) and
//! `limits` (counters) below all of them, and `server` the only module that sees every other.
//!
//! - [`config`]: the file format (`schema`), its checked types, per-section validation, value
//!   parsers, the one table of defaults, and the condition language of rules and policies.
//! - [`catalog`]: providers, credentials, models and deployments, ready for the request path,
//!   with the stable identities that survive a rebuild; the endpoints callers and providers
//!   share and the dialect each speaks (`surface`).
//! - [`attempt`]: every attempt ends in one verdict, decided here for both drivers — how an
//!   attempt ended, what a provider's answer so far means (commit, retry, refuse), whether and
//!   where another attempt runs (bounds, deadline, same-target retries with backoff), what the
//!   caller is told when none is left.
//! - [`health`]: per-target, per-credential and per-deployment records (breakers, cooldowns,
//!   benching, EWMAs), carried across catalog rebuilds by identity; active probes.
//! - [`routing`]: deciding, purely — model resolution, the routing snapshot, policies and
//!   rules compiled into routes (`policy`), the precedence of what a request names and its
//!   plan (`decide`), strategies (`scoring`), per-request lead picks (`lead`), the plan walk
//!   (`plan`), the background ranker, and `explain`, which runs the same decision and walk.
//! - [`adapters`]: the dialects as byte transforms: the JSON scanner, OpenAI's and Anthropic's
//!   dialects, translation between them, the caller's request and the relay of an answer.
//! - [`limits`]: lock-free sliding windows and period budgets; [`keys`]: client keys — who
//!   may call, what they may name, their limits and spend.
//! - [`proxy`]: doing — the `ProxyHttp` implementation, one room per concern: intake,
//!   access (the caller's key), planning, the two attempt drivers (signalbox's own and
//!   Pingora's proxy loop) and what they share (the request, the response, settling a
//!   verdict), accounting.
//! - [`guardrails`]: input checks (patterns, a provider's moderation, a classifier model) run
//!   once before a request's first attempt; [`recommend`]: `POST /v1/routing/recommend`, a
//!   decision model choosing among candidates; [`knn`]: the learned router at work — a
//!   request's embedding and pool before its plan, taught examples, their store (the pure
//!   decision is `routing::knn`).
//! - [`ledger`]: one row per attempt on SQLite or PostgreSQL, written by a background thread
//!   from a bounded queue, and the aggregates read back (admin usage, spend at start).
//! - [`state`]: counters and cooldowns shared across replicas (Redis, or in process), synced
//!   in the background; the request path only reads its own counters.
//! - [`metrics`], [`admin`]: Prometheus metrics (request, health and ledger families) and the
//!   admin listener.
//! - [`dns`]: background re-resolution of provider hosts; [`periodic`]: the loop background
//!   passes share; [`rfc3339`]: instants as RFC 3339 text, the one reader and the one writer.
//! - [`reload`]: a new config validated, built into a snapshot (health carried over) and
//!   swapped in, or refused with nothing changed; admin writes are written back to the file.
//! - [`internal`]: the gateway asking its own models (embeddings, classifiers, recommendations)
//!   through its own listener, so those calls are planned and failed over like any request.
//! - [`server`]: the shared gateway state and the Pingora server assembled from a config.
//! - [`server_tls`]: the proxy listener's TLS certificate (loaded and checked; a leaf that
//!   config validation uses) in the store handshakes read, swapped on reload.
//!
//! The request lifecycle, hook by hook, is the table in [`proxy`]. The mock provider the
//! tests, demo and load tests run against is its own crate, `signalbox-mock`.

pub mod adapters;
pub mod admin;
pub mod attempt;
pub mod catalog;
pub mod config;
pub mod dns;
pub mod edge;
pub mod error;
pub mod glob;
pub mod guardrails;
pub mod health;
pub mod internal;
pub mod keys;
pub mod knn;
pub mod ledger;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod periodic;
pub mod proxy;
pub mod recommend;
pub mod reload;
pub mod rfc3339;
pub mod routing;
pub mod secret;
pub mod server;
pub mod server_tls;
pub mod snapshot;
pub mod state;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
