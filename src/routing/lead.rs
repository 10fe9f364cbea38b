//! Lead picks: the per-request first choice among equivalent candidates.
//!
//! Each pick is a pure function over a *tier* (plan positions of the candidates that may lead:
//! admissible now, of the best priority, or all of them for `weighted` and `cheapest`) and of
//! what it needs to know about each member, passed in as a closure. No health, catalog or
//! clock access and no side effects: the plan gathers the facts and applies the answer, so
//! each pick is tested and benchmarked on its own (`benches/selection.rs`).
//!
//! Draws come from the request's own seed (`splitmix64` steps), so a request's picks are
//! reproducible from its id and independent of other requests.

/// A bijective 64-bit mix: the PRNG step of per-request draws and the mixer of rendezvous
/// hashing.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `r` reduced to an index below `n` (`n > 0`).
fn index(r: u64, n: usize) -> usize {
    usize::try_from(r % n as u64).unwrap_or(0)
}

/// Round robin: the member whose turn this request holds.
pub fn round_robin(tier: &[usize], turn: usize) -> Option<usize> {
    if tier.is_empty() {
        return None;
    }
    tier.get(turn % tier.len()).copied()
}

/// Uniform random: `r` is a fresh 64-bit draw.
pub fn random(tier: &[usize], r: u64) -> Option<usize> {
    if tier.is_empty() {
        return None;
    }
    tier.get(index(r, tier.len())).copied()
}

/// The member with the fewest requests in flight; ties keep tier order.
pub fn least_inflight(tier: &[usize], in_flight: impl Fn(usize) -> u32) -> Option<usize> {
    tier.iter().copied().min_by_key(|&p| in_flight(p))
}

/// Power of two choices: two distinct members drawn from `r`, the cheaper by `cost` wins
/// (the first drawn on a tie).
pub fn p2c(tier: &[usize], r: u64, cost: impl Fn(usize) -> f64) -> Option<usize> {
    match tier.len() {
        0 => None,
        1 => tier.first().copied(),
        n => {
            let a = index(r, n);
            let b = index(r >> 32, n - 1);
            let b = if b >= a { b + 1 } else { b };
            let (pa, pb) = (tier[a], tier[b]);
            Some(if cost(pb) < cost(pa) { pb } else { pa })
        }
    }
}

/// A weighted draw: `unit` is uniform in [0, 1); weights are normalised over the members that
/// have a positive one. Members without a weight never lead (they stay in the failure order).
pub fn weighted(tier: &[usize], weight: impl Fn(usize) -> Option<f64>, unit: f64) -> Option<usize> {
    let positive = |p: usize| weight(p).filter(|w| *w > 0.0 && w.is_finite());
    let total: f64 = tier.iter().filter_map(|&p| positive(p)).sum();
    if total <= 0.0 {
        return None;
    }
    let mut x = unit * total;
    let mut last = None;
    for &p in tier {
        let Some(w) = positive(p) else { continue };
        if x < w {
            return Some(p);
        }
        x -= w;
        last = Some(p);
    }
    // Rounding can leave `x` a hair above the last weight.
    last
}

/// Rendezvous hashing of a prompt prefix: every member scores `mix(key, identity)` and the
/// highest wins, so a prefix keeps its member while the tier changes around it, and members
/// identified by stable hashes map the same way in every replica.
pub fn prefix_affinity(tier: &[usize], key: u64, identity: impl Fn(usize) -> u64) -> Option<usize> {
    tier.iter()
        .copied()
        .max_by_key(|&p| splitmix64(key ^ identity(p).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// The cheapest member for this request's estimated tokens; ties keep tier order.
pub fn cheapest(tier: &[usize], cost: impl Fn(usize) -> u64) -> Option<usize> {
    tier.iter().copied().min_by_key(|&p| cost(p))
}

/// A sticky session: the first member bound to the session (`bound` says which are).
pub fn sticky(tier: &[usize], bound: impl Fn(usize) -> bool) -> Option<usize> {
    tier.iter().copied().find(|&p| bound(p))
}

/// How often a learned strategy sends a request to a healthy candidate it has no latency
/// sample for, and how often to any other healthy candidate.
pub const EXPLORE_UNMEASURED: f64 = 0.25;
pub const EXPLORE_MEASURED: f64 = 0.05;

/// Exploration for strategies that rank by what traffic measured: now and then lead with a
/// healthy member other than the top one, an unmeasured one preferably, so measurements stay
/// current. `healthy` is in ranked order (its first member is the current leader); `roll` is
/// uniform in [0, 1) and `r` a fresh draw.
pub fn explore(
    healthy: &[usize],
    measured: impl Fn(usize) -> bool,
    roll: f64,
    r: u64,
) -> Option<usize> {
    if roll >= EXPLORE_UNMEASURED || healthy.len() < 2 {
        return None;
    }
    let unmeasured = healthy.iter().filter(|&&p| !measured(p)).count();
    if unmeasured > 0 {
        return healthy
            .iter()
            .copied()
            .filter(|&p| !measured(p))
            .nth(index(r, unmeasured));
    }
    if roll >= EXPLORE_MEASURED {
        return None;
    }
    // Any healthy member but the current leader.
    let others = &healthy[1..];
    others.get(index(r, others.len())).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draws(n: u64) -> impl Iterator<Item = u64> {
        (1..=n).map(splitmix64)
    }

    #[test]
    fn round_robin_takes_turns() {
        let tier = [3, 5, 9];
        let picks: Vec<_> = (0..6).filter_map(|t| round_robin(&tier, t)).collect();
        assert_eq!(picks, [3, 5, 9, 3, 5, 9]);
        assert_eq!(round_robin(&[], 4), None);
    }

    #[test]
    fn random_is_uniform() {
        let tier = [0, 1, 2, 3];
        let mut counts = [0u32; 4];
        for r in draws(40_000) {
            counts[random(&tier, r).unwrap_or(0)] += 1;
        }
        for c in counts {
            assert!((9_400..=10_600).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn least_inflight_takes_the_least_loaded_first_on_ties() {
        let load = |p: usize| [4, 1, 1, 7][p];
        assert_eq!(least_inflight(&[0, 1, 2, 3], load), Some(1));
        assert_eq!(least_inflight(&[0, 3], load), Some(0));
    }

    #[test]
    fn p2c_never_picks_the_costlier_of_its_two() {
        let cost = |p: usize| p as f64;
        // With two members both are always compared: the cheaper always wins.
        for r in draws(1_000) {
            assert_eq!(p2c(&[7, 2], r, cost), Some(2));
        }
        // With many, the costliest can only win when drawn against itself: never.
        let tier: Vec<usize> = (0..10).collect();
        for r in draws(1_000) {
            assert_ne!(p2c(&tier, r, cost), Some(9));
        }
        assert_eq!(p2c(&[4], 9, cost), Some(4));
    }

    #[test]
    fn weighted_normalises_and_skips_the_unweighted() {
        let weight = |p: usize| [Some(7.0), Some(3.0), None, Some(0.0)][p];
        let tier = [0, 1, 2, 3];
        let mut counts = [0u32; 4];
        for i in 0..10_000 {
            let unit = (f64::from(i) + 0.5) / 10_000.0;
            counts[weighted(&tier, weight, unit).unwrap_or(2)] += 1;
        }
        assert_eq!(counts, [7_000, 3_000, 0, 0]);
        assert_eq!(weighted(&[2, 3], weight, 0.5), None, "nothing weighted");
        assert_eq!(weighted(&tier, weight, 0.999_999_999), Some(1));
    }

    #[test]
    fn prefix_affinity_is_stable_and_spreads() {
        let identity = |p: usize| splitmix64(p as u64 + 100);
        let tier = [0, 1, 2];
        let mut seen = [0u32; 3];
        for key in draws(3_000) {
            let a = prefix_affinity(&tier, key, identity).unwrap_or(9);
            assert_eq!(prefix_affinity(&tier, key, identity), Some(a));
            seen[a] += 1;
            // Removing another member never moves a key.
            let without: Vec<usize> = tier
                .iter()
                .copied()
                .filter(|&p| p == a || p != (a + 1) % 3)
                .collect();
            assert_eq!(prefix_affinity(&without, key, identity), Some(a));
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }

    #[test]
    fn cheapest_and_sticky() {
        let cost = |p: usize| [30, 10, 10][p];
        assert_eq!(cheapest(&[0, 1, 2], cost), Some(1));
        assert_eq!(sticky(&[0, 1, 2], |p| p == 2), Some(2));
        assert_eq!(sticky(&[0, 1], |p| p == 2), None);
    }

    #[test]
    fn exploration_prefers_the_unmeasured_and_is_rare_otherwise() {
        let healthy = [0, 1, 2];
        // Everything measured: only the rarest rolls explore, never towards the leader.
        assert_eq!(explore(&healthy, |_| true, 0.5, 1), None);
        assert_eq!(explore(&healthy, |_| true, 0.10, 1), None);
        for r in draws(100) {
            let p = explore(&healthy, |_| true, 0.01, r);
            assert!(matches!(p, Some(1 | 2)), "{p:?}");
        }
        // An unmeasured member is explored a quarter of the time.
        assert_eq!(explore(&healthy, |p| p != 2, 0.2, 7), Some(2));
        assert_eq!(explore(&healthy, |p| p != 2, 0.3, 7), None);
        assert_eq!(explore(&[4], |_| false, 0.0, 7), None, "nothing to explore");
    }
}
