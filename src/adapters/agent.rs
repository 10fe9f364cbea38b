//! The client a request came from, named from its `user-agent` (the `params.agent` condition
//! field): coding agents and SDKs identify themselves there, and a rule may send one to the
//! models it works best with.
//!
//! The first entry of [`AGENTS`] whose test holds names the client; a request without a
//! `user-agent`, or with one none recognises, is `unknown`. Matching is a few byte scans over
//! one header, and runs only when a condition reads the field.

/// How an entry recognises its client in a `user-agent`.
#[derive(Debug, Clone, Copy)]
pub enum Test {
    /// The value starts with this (exactly, case included).
    StartsWith(&'static str),
    /// The value contains this, in any case (given in lower case).
    Contains(&'static str),
}

/// The recognised clients, in the order they are tried: the name a condition compares with,
/// and the tests (any may hold). The README's table lists the same.
pub const AGENTS: &[(&str, &[Test])] = &[
    (
        "claude-code",
        &[
            Test::StartsWith("claude-cli/"),
            Test::Contains("claude-code"),
        ],
    ),
    ("codex", &[Test::StartsWith("codex")]),
    ("aider", &[Test::Contains("aider")]),
    ("cursor", &[Test::Contains("cursor")]),
    ("langchain", &[Test::Contains("langchain")]),
    ("litellm", &[Test::Contains("litellm")]),
    ("openai-sdk", &[Test::StartsWith("OpenAI/")]),
    ("anthropic-sdk", &[Test::StartsWith("Anthropic/")]),
];

/// The agent of a request with no `user-agent` or an unrecognised one.
pub const UNKNOWN: &str = "unknown";

/// Whether `name` is a value `params.agent` can take.
pub fn is_agent(name: &str) -> bool {
    name == UNKNOWN || AGENTS.iter().any(|(n, _)| *n == name)
}

/// The agent named by a `user-agent` value.
pub fn of_user_agent(user_agent: Option<&[u8]>) -> &'static str {
    let Some(ua) = user_agent else {
        return UNKNOWN;
    };
    AGENTS
        .iter()
        .find(|(_, tests)| tests.iter().any(|t| t.holds(ua)))
        .map_or(UNKNOWN, |(name, _)| name)
}

impl Test {
    fn holds(self, ua: &[u8]) -> bool {
        match self {
            Test::StartsWith(prefix) => ua.starts_with(prefix.as_bytes()),
            Test::Contains(word) => ua
                .windows(word.len())
                .any(|w| w.eq_ignore_ascii_case(word.as_bytes())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(ua: &str) -> &'static str {
        of_user_agent(Some(ua.as_bytes()))
    }

    #[test]
    fn the_clients_are_named_by_their_own_user_agents() {
        assert_eq!(agent("claude-cli/2.1.332 (external, cli)"), "claude-code");
        assert_eq!(agent("my-wrapper claude-code/1.0"), "claude-code");
        assert_eq!(agent("codex_exec/0.171.0 (Debian 12; x86_64)"), "codex");
        assert_eq!(agent("codex_cli_rs/0.171.0"), "codex");
        assert_eq!(agent("Aider/0.86.2"), "aider");
        assert_eq!(agent("Cursor/1.2"), "cursor");
        assert_eq!(agent("python-requests langchain-openai/1.7.4"), "langchain");
        assert_eq!(agent("LiteLLM/1.110.2"), "litellm");
        assert_eq!(agent("OpenAI/Python 2.8.0"), "openai-sdk");
        assert_eq!(agent("OpenAI/JS 7.59.0"), "openai-sdk");
        assert_eq!(agent("Anthropic/JS 1.15.0"), "anthropic-sdk");
        assert_eq!(agent("curl/8.5.0"), UNKNOWN);
        assert_eq!(of_user_agent(None), UNKNOWN);
    }

    #[test]
    fn the_first_entry_that_holds_wins() {
        // LangChain over the OpenAI SDK sends both words: langchain is tried first.
        assert_eq!(agent("OpenAI/Python 1.0 langchain/0.3"), "langchain");
        // `codex` must start the value; contained, it names nothing.
        assert_eq!(agent("my-codex-tool/1"), UNKNOWN);
        // Prefixes are case-sensitive as the SDKs write them.
        assert_eq!(agent("openai/python"), UNKNOWN);
    }

    #[test]
    fn only_listed_names_are_agents() {
        for (name, _) in AGENTS {
            assert!(is_agent(name));
        }
        assert!(is_agent("unknown"));
        assert!(!is_agent("claude"));
    }
}
