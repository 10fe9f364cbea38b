//! `GET /admin/ready`: may a balancer send this instance traffic? Four things must hold:
//! the config is loaded (it is, or this process would not run), the proxy listener is bound
//! by this process, every chain has at least one candidate that could be called (provider
//! enabled, a usable key, an address), and something can serve right now: while no route has
//! a candidate whose target is closed (every provider ejected, benched or cooling), every
//! request would be a 503, so readiness is 503 too (`nothing_can_serve`; the same state as
//! `signalbox_route_unservable`). Active probes bring ejected targets back without traffic.
//! 503 says which of them does not hold; `routes_that_cannot_serve` lists the routes nothing
//! can serve even while others can (informational: the instance stays ready).
//!
//! Pingora binds each service's listeners asynchronously in that service's runtime, with no
//! signal when it is done, so the admin answering says nothing about the proxy. The listener
//! check reads what the kernel says instead: a socket in `LISTEN` on the proxy's port among
//! this process's own file descriptors (`/proc/self/fd` against `/proc/self/net/tcp{,6}`).
//! Connecting to ourselves would also tell, but on a TLS listener every probe would log a
//! failed handshake.

use std::collections::HashSet;

use serde_json::json;

use crate::snapshot::Runtime;

/// Is a socket of this process listening on TCP `port`? `None` where `/proc` cannot tell
/// (not Linux, or `/proc` not mounted): then the check is skipped, not failed.
pub fn listening(port: u16) -> Option<bool> {
    let mut ours = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        if let Ok(link) = std::fs::read_link(entry.path()) {
            let link = link.to_string_lossy();
            if let Some(inode) = link
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<u64>().ok())
            {
                ours.insert(inode);
            }
        }
    }
    let mut readable = false;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        if listening_in(&text, port, &ours) {
            return Some(true);
        }
    }
    readable.then_some(false)
}

/// One `/proc/net/tcp` table: a `LISTEN` (state `0A`) row on `port` whose inode is ours.
fn listening_in(table: &str, port: u16, ours: &HashSet<u64>) -> bool {
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
            return false;
        };
        let local_port = local
            .rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
        *state == "0A"
            && local_port == Some(port)
            && inode.parse::<u64>().is_ok_and(|i| ours.contains(&i))
    })
}

pub fn ready(router: &Runtime, proxy_port: Option<u16>) -> http::Response<Vec<u8>> {
    let tables = router.snapshot.load_full();
    let catalog = &tables.catalog;
    let mut unready = Vec::new();
    for route in tables
        .routes
        .iter()
        .filter(|r| r.kind == crate::routing::RouteKind::Chain)
    {
        let usable = route.candidates.iter().any(|d| {
            let p = catalog.provider(catalog.deployment(*d).provider);
            p.enabled && p.has_usable_credential() && !p.addrs.is_empty()
        });
        if !usable {
            unready.push(route.name.to_string());
        }
    }
    let bound = proxy_port.and_then(listening).unwrap_or(true);
    let serving = tables.serving();
    let cannot: Vec<&str> = serving
        .iter()
        .filter(|r| !r.can_serve)
        .map(|r| &*r.label)
        .collect();
    let nothing_can_serve = !serving.is_empty() && cannot.len() == serving.len();
    let is_ready = bound && unready.is_empty() && !nothing_can_serve;
    super::json(
        if is_ready { 200 } else { 503 },
        &json!({
            "ready": is_ready,
            "config_generation": tables.generation,
            "proxy_listener_bound": bound,
            "chains_without_a_usable_candidate": unready,
            "nothing_can_serve": nothing_can_serve,
            "routes_that_cannot_serve": cannot,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F91 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn a_listen_row_on_the_port_counts_only_when_the_socket_is_ours() {
        let ours: HashSet<u64> = [4242, 4343].into_iter().collect();
        assert!(listening_in(TABLE, 8080, &ours));
        assert!(
            !listening_in(TABLE, 8080, &HashSet::from([1])),
            "not our socket"
        );
        assert!(
            !listening_in(TABLE, 8081, &ours),
            "established, not listening"
        );
        assert!(!listening_in(TABLE, 9090, &ours));
    }

    #[test]
    fn a_socket_this_process_listens_on_is_found() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if let Some(found) = listening(port) {
            assert!(found);
            drop(l);
            assert_eq!(listening(port), Some(false));
        }
    }
}
