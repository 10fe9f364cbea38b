//! Sticky sessions (`x-llm-session`): a session id maps to the deployment that last served it,
//! for `session_ttl`.
//!
//! A fixed-size, direct-mapped table of atomics: no lock and no allocation on the request
//! path, bounded memory whatever callers send. It approximates a map: two sessions hashing to
//! the same slot evict each other, and a read racing a write may pair one session's tag with
//! the other's value for that one request. Affinity is a preference, never a correctness
//! property (the deployment must still be in the plan and healthy), so both are acceptable.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::catalog::DeploymentIdx;

const SLOTS: usize = 1 << 16;
const EXPIRY_BITS: u32 = 40;
const EXPIRY_MASK: u64 = (1 << EXPIRY_BITS) - 1;

pub struct SessionTable {
    tags: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
    ttl_ms: u64,
}

impl std::fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// A stable 64-bit hash (SipHash with fixed keys): the same id maps the same way in every
/// process, so replicas agree on prefix affinity.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x5167_6e61_6c62_6f78, 0x7374_6963_6b79_0001);
    bytes.hash(&mut h);
    h.finish()
}

impl SessionTable {
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            tags: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            values: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            ttl_ms,
        }
    }

    fn slot(hash: u64) -> usize {
        (hash as usize) & (SLOTS - 1)
    }

    /// The deployment a live session is bound to.
    pub fn get(&self, session_hash: u64, now_ms: u64) -> Option<DeploymentIdx> {
        let i = Self::slot(session_hash);
        if self.tags[i].load(Ordering::Acquire) != session_hash {
            return None;
        }
        let v = self.values[i].load(Ordering::Acquire);
        let expires = v & EXPIRY_MASK;
        if v == 0 || (now_ms & EXPIRY_MASK) >= expires {
            return None;
        }
        u32::try_from(v >> EXPIRY_BITS).ok().map(DeploymentIdx)
    }

    /// Bind (or refresh) a session.
    pub fn put(&self, session_hash: u64, d: DeploymentIdx, now_ms: u64) {
        if d.0 >= (1 << (64 - EXPIRY_BITS)) {
            return;
        }
        let i = Self::slot(session_hash);
        let expires = (now_ms + self.ttl_ms) & EXPIRY_MASK;
        self.values[i].store((u64::from(d.0) << EXPIRY_BITS) | expires, Ordering::Release);
        self.tags[i].store(session_hash, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_and_expires() {
        let t = SessionTable::new(1_000);
        let h = stable_hash(b"conversation-42");
        assert_eq!(t.get(h, 10), None);
        t.put(h, DeploymentIdx(7), 10);
        assert_eq!(t.get(h, 500), Some(DeploymentIdx(7)));
        assert_eq!(t.get(h ^ 1, 500), None);
        assert_eq!(t.get(h, 1_010), None);
        assert_eq!(stable_hash(b"x"), stable_hash(b"x"));
    }
}
