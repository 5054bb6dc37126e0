//! Creation times, for proofs of lineage (`objects.notOlderThan`): an
//! object's `metadata.creationTimestamp` is set by the API server when the
//! object is created and cannot be changed afterwards, so it tells whether
//! an object was made after another one, whoever writes it later.

use serde_json::Value;

/// Seconds since the Unix epoch of `obj`'s `metadata.creationTimestamp`;
/// `None` when it is missing or not an RFC 3339 timestamp.
pub fn creation_time(obj: &Value) -> Option<i64> {
    obj["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(parse_rfc3339)
}

/// Seconds since the Unix epoch of an RFC 3339 timestamp
/// (`2006-01-02T15:04:05Z`, with optional fractional seconds, which are
/// dropped, and a `Z` or `±hh:mm` offset); `None` for anything else.
/// Compared as numbers, never as text: `...+01:00` and `...Z` mean
/// different instants.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let part = b.get(from..to)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let sep = |at: usize, c: &[u8]| b.get(at).is_some_and(|x| c.contains(x));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt") && sep(13, b":") && sep(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let mut rest = &b[19..];
    if let Some((b'.', frac)) = rest.split_first() {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let two = |a: u8, b: u8| -> Option<i64> {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| i64::from(a - b'0') * 10 + i64::from(b - b'0'))
            };
            let (h, m) = (two(*h1, *h2)?, two(*m1, *m2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let s = (h * 60 + m) * 60;
            if *sign == b'+' { s } else { -s }
        }
        _ => return None,
    };
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap(year) => 29,
        2 => 28,
        _ => return None,
    };
    if day < 1 || day > days_in || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second - offset)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_read_as_instants() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(parse_rfc3339("2024-02-29T12:00:00Z"), Some(1_709_208_000));
        // An offset is an instant too: not compared as text.
        assert_eq!(
            parse_rfc3339("2024-01-01T01:00:00+01:00"),
            parse_rfc3339("2024-01-01T00:00:00Z")
        );
        assert_eq!(
            parse_rfc3339("2024-01-01T00:00:00.999Z"),
            parse_rfc3339("2024-01-01T00:00:00Z")
        );
        for bad in [
            "",
            "2024-01-01",
            "2024-01-01T00:00:00",
            "2023-02-29T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00+1:00",
            "2024-01-01 00:00:00Z",
            "+024-01-01T00:00:00Z",
            "2024-01-01T00:00:00Zjunk",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
