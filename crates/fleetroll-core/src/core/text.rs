//! Text cut to fit a bound: status messages, events, and what other systems answer. Bounds are in bytes of
//! UTF-8, decided once here: the API server and etcd limit bytes, and a string of n bytes never has more
//! than n characters, so a byte bound keeps within a CRD's `maxLength` too.

/// What ends a text that was cut.
const MARK: &str = "…";

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub fn clip(text: &str, max: usize) -> &str {
    &text[..text.floor_char_boundary(max)]
}

/// `text` in at most `max` bytes, ending in "…" when it had to be cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    match max.checked_sub(MARK.len()) {
        Some(room) => format!("{}{MARK}", clip(text, room)),
        None => clip(text, max).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_text_fits_its_bound_on_a_character_boundary_and_says_it_was_cut() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("exactly10!", 10), "exactly10!");
        assert_eq!(cut("0123456789abc", 10), "0123456…");
        // "é" is two bytes: never split.
        let said = cut(&"é".repeat(100), 10);
        assert!(said.len() <= 10 && said.ends_with("é…"), "{said}");
        assert_eq!(cut("abcdef", 2), "ab", "no room for the mark");
        assert_eq!(clip("aé", 2), "a");
        assert_eq!(clip("abc", 0), "");
    }

    proptest::proptest! {
        #[test]
        fn no_text_or_bound_makes_it_panic_or_overflow(text in ".{0,64}", max in 0usize..80) {
            let said = cut(&text, max);
            proptest::prop_assert!(said.len() <= max);
            proptest::prop_assert!(text.starts_with(said.trim_end_matches(MARK)));
            proptest::prop_assert!(clip(&text, max).len() <= max);
        }
    }
}
