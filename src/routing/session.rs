//! Sticky sessions (`x-llm-session`): a session id maps to the deployment that last served it,
//! for `session_ttl`. The deployment is recorded by its identity (the top bits of
//! [`Deployment::key_hash`](crate::catalog::Deployment::key_hash)), not its position, so a
//! session survives a config reload that reorders the catalog.
//!
//! A fixed-size, direct-mapped table of atomics: no lock and no allocation on the request
//! path, bounded memory whatever callers send. It approximates a map: two sessions hashing to
//! the same slot evict each other, and a read racing a write may pair one session's tag with
//! the other's value for that one request. Affinity is a preference, never a correctness
//! property (the deployment must still be in the plan and healthy), so both are acceptable.

use std::sync::atomic::{AtomicU64, Ordering};

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

    /// The deployment tag (24 bits of its identity hash) a live session is bound to.
    pub fn get(&self, session_hash: u64, now_ms: u64) -> Option<u64> {
        let i = Self::slot(session_hash);
        if self.tags[i].load(Ordering::Acquire) != session_hash {
            return None;
        }
        let v = self.values[i].load(Ordering::Acquire);
        let expires = v & EXPIRY_MASK;
        if v == 0 || (now_ms & EXPIRY_MASK) >= expires {
            return None;
        }
        Some(v >> EXPIRY_BITS)
    }

    /// Bind (or refresh) a session to a deployment tag (`plan::session_tag`, 24 bits).
    pub fn put(&self, session_hash: u64, tag: u64, now_ms: u64) {
        let i = Self::slot(session_hash);
        let expires = (now_ms + self.ttl_ms) & EXPIRY_MASK;
        let tag = tag & ((1 << (64 - EXPIRY_BITS)) - 1);
        self.values[i].store((tag << EXPIRY_BITS) | expires, Ordering::Release);
        self.tags[i].store(session_hash, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::stable_hash;

    #[test]
    fn binds_and_expires() {
        let t = SessionTable::new(1_000);
        let h = stable_hash(b"conversation-42");
        assert_eq!(t.get(h, 10), None);
        t.put(h, 0xab_cdef, 10);
        assert_eq!(t.get(h, 500), Some(0xab_cdef));
        assert_eq!(t.get(h ^ 1, 500), None);
        assert_eq!(t.get(h, 1_010), None);
        assert_eq!(stable_hash(b"x"), stable_hash(b"x"));
    }
}
