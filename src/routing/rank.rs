//! The scored tables: [`Rankings`] is an immutable snapshot of, for every route, its
//! candidates ordered by the route's strategy (learned strategies from live health), built by
//! a pure function of the route table and health at one instant. The ranker
//! (`crate::snapshot::RankerService`) rebuilds it in the background and swaps it in; the
//! request path only loads it.
//!
//! Between two passes the order can be up to one interval stale; the plan re-checks every
//! candidate against live health as it walks, so staleness costs ordering, never a call to an
//! ejected target.

use std::sync::Arc;

use super::scoring::{rank, RankBy};
use super::table::{RouteIdx, RouteTable};
use crate::catalog::DeploymentIdx;

/// Ranked candidate orders per route, for one route table generation.
#[derive(Debug)]
pub struct Rankings {
    pub tables_generation: u64,
    pub built_ms: u64,
    pub orders: Vec<Arc<[DeploymentIdx]>>,
    /// The soonest moment an ejection, bench or cooldown seen in this pass ends: the ranker
    /// wakes then, so a recovered target regains its place without waiting for the tick.
    pub next_change_ms: Option<u64>,
}

impl Rankings {
    /// Rank every route of `tables` from its health at `now_ms`.
    pub fn build(tables: &RouteTable, now_ms: u64) -> Self {
        let health = &tables.health;
        let orders = tables
            .routes
            .iter()
            .map(|r| {
                if r.candidates.len() <= 1 {
                    return r.candidates.clone();
                }
                // Each segment on its own: a policy's targets keep their order.
                let mut order = Vec::with_capacity(r.candidates.len());
                for s in r.segments.iter() {
                    let part = &r.candidates[s.range.clone()];
                    if part.len() <= 1 {
                        order.extend_from_slice(part);
                    } else {
                        order.extend(rank(
                            &tables.catalog,
                            health,
                            part,
                            RankBy::nominal(
                                s.strategy,
                                tables.routing.custom_weights,
                                tables.routing.scoring,
                                now_ms,
                            ),
                        ));
                    }
                }
                Arc::from(order)
            })
            .collect();
        let next_change_ms = tables
            .catalog
            .deployments
            .iter()
            .filter_map(|d| {
                health
                    .deployment_view(&tables.catalog, d.idx, now_ms)
                    .soonest_ms
            })
            .min();
        Self {
            tables_generation: tables.generation,
            built_ms: now_ms,
            orders,
            next_change_ms,
        }
    }

    /// The ranked order of a route, or its configured order if these rankings are for
    /// another generation of the tables.
    pub fn order(&self, tables: &RouteTable, route: RouteIdx) -> Arc<[DeploymentIdx]> {
        if self.tables_generation == tables.generation {
            if let Some(o) = self.orders.get(route.get()) {
                return o.clone();
            }
        }
        tables.route(route).candidates.clone()
    }
}
