//! signalbox: an LLM gateway on Pingora.
//!
//! Callers send OpenAI-shaped `POST /v1/chat/completions`; signalbox resolves the `model`
//! string to a route, walks the route's candidates (deployment × credential) and fails over
//! to the next one when an attempt fails before the caller received a byte.
//!
//! Dependencies point one way: `config` → `catalog` → `routing` → `proxy`. The request
//! lifecycle, hook by hook, is documented in [`proxy`]; what counts as a failure lives in
//! [`retry`]; provider dialects are byte transforms in [`adapters`].
//!
//! - [`config`]: the file format and its validation.
//! - [`catalog`]: providers, credentials, models and deployments, ready for the request path.
//! - [`routing`]: model resolution, the routing snapshot and per-request plans.
//! - [`retry`]: failure classification and the final error.
//! - [`proxy`]: the `ProxyHttp` implementation.
//! - [`metrics`], [`admin`]: Prometheus metrics and the admin listener.
//! - [`dns`]: background re-resolution of provider hosts.
//! - [`server`]: assembling the Pingora server from a config.

pub mod adapters;
pub mod admin;
pub mod catalog;
pub mod config;
pub mod dns;
pub mod error;
pub mod health;
pub mod metrics;
pub mod proxy;
pub mod retry;
pub mod routing;
pub mod secret;
pub mod server;
pub mod telemetry;
