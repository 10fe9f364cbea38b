//! The server process: `listen` (where signalbox accepts traffic) and `pingora` (the subset
//! of Pingora's own server settings signalbox exposes, passed on as written once checked).

use crate::config::schema::{ListenSection, PingoraSection};
use crate::config::types::Listen;
use crate::config::values::check_listen_addr;
use crate::config::ConfigError;

pub(super) fn validate_listen(l: &ListenSection, errs: &mut Vec<ConfigError>) -> Listen {
    Listen {
        proxy: check_listen_addr(&l.proxy, "listen.proxy", errs),
        admin: check_listen_addr(&l.admin, "listen.admin", errs),
    }
}

pub(super) fn validate_pingora(p: &PingoraSection, errs: &mut Vec<ConfigError>) {
    if p.threads == Some(0) {
        errs.push(ConfigError::new("pingora.threads", "must be at least 1"));
    }
    if p.listener_tasks_per_fd == Some(0) {
        errs.push(ConfigError::new(
            "pingora.listener_tasks_per_fd",
            "must be at least 1",
        ));
    }
    if let Some(ca) = &p.ca_file {
        if !std::path::Path::new(ca).is_file() {
            errs.push(ConfigError::new(
                "pingora.ca_file",
                format!("{ca:?} is not a readable file"),
            ));
        }
    }
}
