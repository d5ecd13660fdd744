//! What an error, a log line or a terminal may show of a store's URL: the
//! URL with its passwords masked, and the passwords themselves, for a
//! caller that scrubs them out of text quoting the URL another way.

/// `url` with the password of each `user:password@` (a cluster's or
/// Sentinel's URL names several hosts) and any `password=` query
/// parameter replaced by `***`. The user info runs to the last `@` (a
/// password may hold an unencoded `/` or `?`); a URL whose query holds an
/// `@` may lose more than its password, never less.
///
/// ```
/// use saga_runtime::backend::redacted;
/// assert_eq!(redacted("postgres://app:s3cret@db:5432/orders"), "postgres://app:***@db:5432/orders");
/// assert_eq!(redacted("postgres://app:a/b?c@db/orders"), "postgres://app:***@db/orders");
/// assert_eq!(redacted("postgres://db/orders?user=app&password=s3cret"), "postgres://db/orders?user=app&password=***");
/// assert_eq!(redacted("redis://:pw@cache:6379/0"), "redis://:***@cache:6379/0");
/// assert_eq!(redacted("redis+cluster://:a@h:1,:b@h:2"), "redis+cluster://:***@h:1,:***@h:2");
/// assert_eq!(redacted("redis://cache:6379"), "redis://cache:6379");
/// ```
pub fn redacted(url: &str) -> String {
    split_secrets(url).0
}

/// The passwords [`redacted`] masks in `url`, as written and, where they
/// hold `%` escapes, decoded (a client library may quote either).
pub fn url_secrets(url: &str) -> Vec<String> {
    split_secrets(url).1
}

/// `url` as [`redacted`] shows it, and the secrets it masked.
///
/// The user info ends at the URL's last `@`, not where a URL parser ends
/// the authority (the first `/`, `?` or `#`): a password typed with one of
/// those unencoded (`postgres://ana:a/b@db/shop`) is still the password the
/// operator meant, and a parser's reading would print it. An `@` in the
/// query of a URL with a password then masks more than the password,
/// which is the side to err on.
fn split_secrets(url: &str) -> (String, Vec<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), Vec::new());
    };
    let end = match rest.rfind('@') {
        Some(at) => rest[at..]
            .find(['/', '?', '#'])
            .map_or(rest.len(), |e| at + e),
        None => rest.find(['/', '?', '#']).unwrap_or(rest.len()),
    };
    let (authority, tail) = rest.split_at(end);
    let mut secrets = Vec::new();
    // Only a cluster's or Sentinel's URL lists hosts that each may carry
    // credentials; in another, a `,` may be part of the password.
    let hosts: Vec<&str> = match scheme.starts_with("redis+") {
        true => authority.split(',').collect(),
        false => vec![authority],
    };
    let authority: Vec<String> = hosts
        .into_iter()
        .map(|host| match host.rsplit_once('@') {
            Some((userinfo, at)) => match userinfo.split_once(':') {
                Some((user, password)) => {
                    secrets.push(password.to_owned());
                    format!("{user}:***@{at}")
                }
                None => host.to_owned(),
            },
            None => host.to_owned(),
        })
        .collect();
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if key.eq_ignore_ascii_case("password") => {
                        secrets.push(value.split('#').next().unwrap_or("").to_owned());
                        format!("{key}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    let decoded: Vec<String> = secrets.iter().filter_map(|s| percent_decoded(s)).collect();
    secrets.extend(decoded);
    (format!("{scheme}://{}{tail}", authority.join(",")), secrets)
}

/// `text` (`%40` and the like decoded), if it holds an escape: the form a
/// client library may quote a password in.
fn percent_decoded(text: &str) -> Option<String> {
    if !text.contains('%') {
        return None;
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().filter(|d| d != text)
}
