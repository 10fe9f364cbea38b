//! The `patterns` kind: flagged when any of the profile's regular expressions matches the
//! input text. In process; the `regex` crate matches in time linear in the text, and every
//! pattern was bounded at load like a rule's `$regex`.

/// Whether any pattern matches `text`.
pub fn flags(patterns: &[regex::Regex], text: &str) -> bool {
    patterns.iter().any(|re| re.is_match(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_pattern_flags() {
        let res = [
            regex::Regex::new(r"(?i)password\s*[:=]").expect("re"),
            regex::Regex::new("BEGIN RSA PRIVATE KEY").expect("re"),
        ];
        assert!(flags(&res, "my PASSWORD: hunter2"));
        assert!(flags(&res, "-----BEGIN RSA PRIVATE KEY-----"));
        assert!(!flags(&res, "what is a password manager?"));
        assert!(!flags(&[], "anything"));
    }
}
