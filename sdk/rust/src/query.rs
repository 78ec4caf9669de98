//! The request's query string, decoded.

/// The query's `key=value` pairs, percent-decoded, `+` read as a space.
pub fn query_pairs<B>(request: &http::Request<B>) -> Vec<(String, String)> {
    request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

/// The first value of `key` in the query.
pub fn query<B>(request: &http::Request<B>, key: &str) -> Option<String> {
    query_pairs(request).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[index + 1..index + 3])
                    .ok()
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                {
                    Some(byte) => {
                        out.push(byte);
                        index += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_decoded() {
        let request = http::Request::get("/x?name=J%C3%BCrgen+Smith&empty=&flag&a=%zz")
            .body(())
            .unwrap();
        assert_eq!(
            query_pairs(&request),
            vec![
                ("name".into(), "Jürgen Smith".into()),
                ("empty".into(), "".into()),
                ("flag".into(), "".into()),
                ("a".into(), "%zz".into()),
            ]
        );
        assert_eq!(query(&request, "name").as_deref(), Some("Jürgen Smith"));
        assert_eq!(query(&request, "missing"), None);
    }
}
