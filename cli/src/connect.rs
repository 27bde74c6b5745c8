//! The client the tool reads through: the library's own builder, as an application configures it, so the
//! tool sees exactly what the application's clients see.

use std::io::BufRead;

use crate::{Exit, Failure, ServerArgs};

/// Where to connect when neither `--url` nor `$REDIS_URL` says.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379/";

/// Connects as `args` say. `build()` checks the server as for any client (PING and a probe lock of its own,
/// which listings skip), so a wrong address, password or ACL fails here, with the library's message.
pub(crate) async fn client(args: &ServerArgs) -> Result<distlock::Client, Failure> {
    if let Some(url) = &args.postgres {
        let mut stdin = std::io::stdin().lock();
        let url = match args.password_stdin {
            true => with_password(url, &read_password(&mut stdin, "--password-stdin")?)?,
            false => url.clone(),
        };
        let builder = distlock::Client::builder()
            .postgres(url)
            .postgres_schema(args.schema.clone())
            .key_prefix(args.prefix.clone())
            .connect_timeout(args.timeout)
            .response_timeout(args.timeout);
        return Ok(builder.build().await?);
    }
    let mut urls = args.url.clone();
    if urls.is_empty() {
        urls.push(std::env::var("REDIS_URL").ok().filter(|u| !u.trim().is_empty()).unwrap_or(DEFAULT_URL.into()));
    }
    // Behind Sentinel the password is the data nodes' (the primary's, now and after a failover); the sentinels'
    // is read after it, or goes in their URLs.
    let mut stdin = std::io::stdin().lock();
    let password = if args.password_stdin { Some(read_password(&mut stdin, "--password-stdin")?) } else { None };
    // Clap refuses --sentinel-password-stdin without --sentinel.
    if args.sentinel_password_stdin {
        let sentinels = read_password(&mut stdin, "--sentinel-password-stdin")?;
        urls = urls.iter().map(|url| with_password(url, &sentinels)).collect::<Result<_, _>>()?;
    }
    if let (Some(password), None) = (&password, &args.sentinel) {
        urls = urls.iter().map(|url| with_password(url, password)).collect::<Result<_, _>>()?;
    }
    let builder = distlock::Client::builder()
        .key_prefix(args.prefix.clone())
        .connect_timeout(args.timeout)
        .response_timeout(args.timeout);
    let builder = match (&args.sentinel, args.cluster, args.redlock) {
        (Some(service), ..) => match password {
            Some(password) => {
                builder.redis_sentinel(urls, service.clone()).sentinel_primary_password(args.user.as_deref(), password)
            }
            None => builder.redis_sentinel(urls, service.clone()),
        },
        (None, true, _) => builder.redis_cluster(urls),
        (None, false, true) => builder.redlock(urls),
        (None, false, false) => match <[String; 1]>::try_from(urls) {
            Ok([url]) => builder.redis(url),
            Err(_) => {
                return Err(Failure::new(
                    Exit::Usage,
                    "several --url given: add --cluster (seeds of a cluster), --sentinel SERVICE (sentinels) or \
                     --redlock (a Redlock group), or give one --url",
                ))
            }
        },
    };
    Ok(builder.build().await?)
}

/// The next line of standard input, without its line ending; `option` asked for it.
fn read_password(stdin: &mut impl BufRead, option: &str) -> Result<String, Failure> {
    let mut line = String::new();
    stdin
        .read_line(&mut line)
        .map_err(|e| Failure::new(Exit::Usage, format!("{option}: cannot read standard input: {e}")))?;
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err(Failure::new(
            Exit::Usage,
            format!("{option}: standard input held no password (a line of its own)"),
        ));
    }
    Ok(password.to_owned())
}

/// `url` with `password` as its password (percent-encoded); a unix socket's goes in its `pass` parameter.
/// Errors never show the password, nor a password already in the URL.
fn with_password(url: &str, password: &str) -> Result<String, Failure> {
    let bad = || {
        Failure::new(
            Exit::Usage,
            "--password-stdin: a --url is not a URL the password can be added to (expected \
             redis://HOST[:PORT][/DB], rediss://…, redis+unix:///PATH or postgres://USER@HOST[:PORT]/DBNAME)",
        )
    };
    let mut parsed = url::Url::parse(url).map_err(|_| bad())?;
    if parsed.scheme() == "redis+unix" || parsed.scheme() == "unix" {
        let others: Vec<(String, String)> =
            parsed.query_pairs().filter(|(k, _)| k != "pass").map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        parsed.query_pairs_mut().clear().extend_pairs(others).append_pair("pass", password);
    } else {
        parsed.set_password(Some(password)).map_err(|()| bad())?;
    }
    Ok(parsed.into())
}

#[cfg(test)]
mod tests {
    use super::with_password;

    #[test]
    fn the_password_goes_into_the_url_encoded() {
        assert_eq!(with_password("redis://h:1/0", "p@ss/w").unwrap(), "redis://:p%40ss%2Fw@h:1/0");
        assert_eq!(with_password("redis://user:old@h/", "new").unwrap(), "redis://user:new@h/");
        assert_eq!(
            with_password("redis+unix:///tmp/r.sock?db=1", "s").unwrap(),
            "redis+unix:///tmp/r.sock?db=1&pass=s"
        );
        let refused = with_password("not a url with secret", "pw").unwrap_err();
        assert!(!refused.message.contains("secret") && !refused.message.contains("pw"), "{}", refused.message);
    }
}
