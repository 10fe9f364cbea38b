//! A client key's own routing (`keys[].routing`: seed 002's organisation policy, held per key):
//! a strategy, a provider order, excluded providers and an attempt bound, compiled once per
//! snapshot into per-provider tables so a request reads an index, never a name.
//!
//! Precedence, field by field: the request's `routing` › the key's › the route's (or the
//! platform's) default. A request that sets only `strategy` still gets the key's provider
//! order; a request's `routing.providers` replaces it. The exclusion is the exception: no
//! request can undo it — a request's `routing.providers` naming an excluded provider leaves it
//! excluded (skipped as `excluded_by_key`).

use std::sync::Arc;

use crate::catalog::ProviderIdx;
use crate::config::{AskedStrategy, KeyRoutingConfig};

/// The place of a provider the key's `provider_order` does not list: after every listed one.
pub const UNORDERED: u32 = u32::MAX;

/// One key's routing, as the request path reads it.
#[derive(Debug)]
pub struct KeyRouting {
    /// Replaces the route's strategy when the request asks for none.
    pub strategy: Option<AskedStrategy>,
    /// `provider_order`, as written.
    order: Box<[ProviderIdx]>,
    /// Per provider (by index): its place in `order`, [`UNORDERED`] when not listed. Empty
    /// when the key orders none.
    rank: Box<[u32]>,
    /// Per provider (by index): whether the key excludes it; `None`: it excludes none.
    excluded: Option<Arc<[bool]>>,
    /// `max_attempts`, when set.
    max_attempts: Option<u32>,
}

impl KeyRouting {
    /// Compile a key's `routing` against a catalog of `providers` providers (config indices are
    /// catalog indices).
    pub fn build(c: &KeyRoutingConfig, providers: usize) -> Self {
        let to_idx = |p: usize| ProviderIdx(u32::try_from(p).unwrap_or(u32::MAX));
        let order: Box<[ProviderIdx]> = c.provider_order.iter().map(|&p| to_idx(p)).collect();
        let rank: Box<[u32]> = if order.is_empty() {
            Box::default()
        } else {
            (0..providers)
                .map(|p| {
                    c.provider_order
                        .iter()
                        .position(|&o| o == p)
                        .and_then(|at| u32::try_from(at).ok())
                        .unwrap_or(UNORDERED)
                })
                .collect()
        };
        let excluded = (!c.exclude_providers.is_empty()).then(|| {
            (0..providers)
                .map(|p| c.exclude_providers.contains(&p))
                .collect()
        });
        Self {
            strategy: c.strategy,
            order,
            rank,
            excluded,
            max_attempts: c.max_attempts,
        }
    }

    /// Whether the key orders providers (`provider_order` lists one or more).
    #[inline]
    pub fn orders_providers(&self) -> bool {
        !self.order.is_empty()
    }

    /// A provider's place in the key's `provider_order` ([`UNORDERED`] when not listed).
    #[inline]
    pub fn rank(&self, provider: ProviderIdx) -> u32 {
        self.rank.get(provider.get()).copied().unwrap_or(UNORDERED)
    }

    /// `provider_order`, as written.
    pub fn provider_order(&self) -> &[ProviderIdx] {
        &self.order
    }

    /// Per provider (by index), whether the key excludes it; `None` when it excludes none.
    pub fn excluded(&self) -> Option<&Arc<[bool]>> {
        self.excluded.as_ref()
    }

    /// Whether the key excludes `provider`.
    pub fn excludes(&self, provider: ProviderIdx) -> bool {
        self.excluded
            .as_ref()
            .is_some_and(|e| e.get(provider.get()).copied().unwrap_or(false))
    }

    /// The attempt bound of one of this key's requests on a route bounded by `route_max` (a
    /// policy's `max_attempts`, else `failover.max_attempts`): the smaller of the two. A key
    /// may lower the route's bound, never raise it: the route's bound is what the operator sized
    /// the upstreams' load for, and a key is one caller among many.
    pub fn max_attempts(&self, route_max: u32) -> u32 {
        self.max_attempts.map_or(route_max, |k| k.min(route_max))
    }

    /// `max_attempts` as configured.
    pub fn configured_max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;

    #[test]
    fn providers_are_ranked_and_excluded_by_index_and_attempts_only_lowered() {
        let r = KeyRouting::build(
            &KeyRoutingConfig {
                strategy: AskedStrategy::parse("cheapest"),
                provider_order: vec![2, 0],
                exclude_providers: vec![1],
                max_attempts: Some(2),
            },
            4,
        );
        assert_eq!(r.strategy.map(|s| s.strategy), Some(Strategy::Cheapest));
        assert!(r.orders_providers());
        let ranks: Vec<u32> = (0..5).map(|p| r.rank(ProviderIdx(p))).collect();
        assert_eq!(ranks, [1, UNORDERED, 0, UNORDERED, UNORDERED]);
        assert!(r.excludes(ProviderIdx(1)) && !r.excludes(ProviderIdx(0)));
        assert!(!r.excludes(ProviderIdx(9)), "out of range: not excluded");
        assert_eq!((r.max_attempts(5), r.max_attempts(1)), (2, 1));
        let none = KeyRouting::build(&KeyRoutingConfig::default(), 4);
        assert!(!none.orders_providers() && none.excluded().is_none());
        assert_eq!(none.rank(ProviderIdx(0)), UNORDERED);
        assert_eq!(none.max_attempts(3), 3);
    }
}
