//! `log`: how signalbox writes its log (the format of every line on stderr).

use crate::config::schema::LogSection;
use crate::config::types::{LogConfig, LogFormat};
use crate::config::ConfigError;

pub(super) fn validate_log(l: &LogSection, errs: &mut Vec<ConfigError>) -> LogConfig {
    let Some(format) = LogFormat::parse(&l.format) else {
        let known: Vec<&str> = LogFormat::ALL.iter().map(|f| f.as_str()).collect();
        errs.push(ConfigError::new(
            "log.format",
            format!(
                "unknown format {:?}: expected one of {}",
                l.format,
                known.join(", ")
            ),
        ));
        return LogConfig::default();
    };
    LogConfig { format }
}
