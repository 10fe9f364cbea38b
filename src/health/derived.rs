//! Derived states (seed 002): one word per provider and per model, read from its targets'
//! admissions at the moment asked (`/admin/health`, `/metrics`); nothing is stored.
//!
//! - `disabled`: switched off in the config (a model also when every provider serving it is).
//! - `healthy`: every target (deployment × credential) is usable: admitted, or half-open.
//! - `degraded`: some are ejected, cooling or benched, some still usable.
//! - `unhealthy`: none is usable (a provider with no usable credential included).

use super::{Admission, HealthRegistry, Unavailable};
use crate::catalog::Catalog;

/// One provider's or model's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DerivedState {
    Healthy,
    Degraded,
    Unhealthy,
    Disabled,
}

impl DerivedState {
    pub const ALL: [DerivedState; 4] = [
        DerivedState::Healthy,
        DerivedState::Degraded,
        DerivedState::Unhealthy,
        DerivedState::Disabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DerivedState::Healthy => "healthy",
            DerivedState::Degraded => "degraded",
            DerivedState::Unhealthy => "unhealthy",
            DerivedState::Disabled => "disabled",
        }
    }

    fn of(usable: usize, total: usize) -> Self {
        match (usable, total) {
            (0, _) => DerivedState::Unhealthy,
            (u, t) if u == t => DerivedState::Healthy,
            _ => DerivedState::Degraded,
        }
    }
}

/// The state of every provider and of every model, in catalog order.
pub fn derived_states(
    catalog: &Catalog,
    reg: &HealthRegistry,
    now_ms: u64,
) -> (Vec<DerivedState>, Vec<DerivedState>) {
    let mut providers = vec![(0usize, 0usize); catalog.providers.len()];
    let mut models = vec![(0usize, 0usize); catalog.models.len()];
    for t in reg.targets_of(catalog) {
        let Some(d) = t.deployment else { continue };
        let provider = catalog.provider(t.provider);
        if !provider.enabled {
            continue;
        }
        let usable = provider.credentials[t.credential].usable
            && matches!(
                reg.admission(t, now_ms),
                Admission::Healthy { .. }
                    | Admission::HalfOpen
                    | Admission::No(Unavailable::ProbeBusy)
            );
        let count = |c: &mut (usize, usize)| {
            c.1 += 1;
            c.0 += usize::from(usable);
        };
        count(&mut providers[t.provider.get()]);
        if let Some(m) = catalog.deployment(d).model {
            count(&mut models[m.get()]);
        }
    }
    let providers = catalog
        .providers
        .iter()
        .zip(providers)
        .map(|(p, (u, t))| {
            if p.enabled {
                DerivedState::of(u, t)
            } else {
                DerivedState::Disabled
            }
        })
        .collect();
    let models = catalog
        .models
        .iter()
        .zip(models)
        .map(|(m, (u, t))| {
            let served = m
                .deployments
                .iter()
                .any(|d| catalog.provider(catalog.deployment(*d).provider).enabled);
            if m.enabled && served {
                DerivedState::of(u, t)
            } else {
                DerivedState::Disabled
            }
        })
        .collect();
    (providers, models)
}
