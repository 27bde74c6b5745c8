//! Sentinel with passwords, as production deployments set them: the sentinels behind a password of their own
//! (given in their URLs), the data nodes behind `requirepass`/`masterauth` and an ACL user (given with
//! `sentinel_primary_password`). Locks work, a wrong or missing password is an error that names what to fix
//! and never shows it, and a failover (the primary killed) is followed with the same credentials.

use std::time::Duration;

use distlock::{Client, ClientBuilder, ReleaseOutcome};
use distlock_tests::eventually;
use distlock_tests::sentinel::{Passwords, SentinelGroup, SERVICE};
use tokio::time::Instant;

const PASSWORDS: Passwords =
    Passwords { data: "d4ta-s3cret", acl_user: ("locker", "l0cker-s3cret"), sentinel: "s3ntinel-s3cret" };

/// A builder for the group with `sentinel_password` in the sentinels' URLs (none if `None`) and the data nodes'
/// ACL user with `data_password`.
fn builder(group: &SentinelGroup, sentinel_password: Option<&str>, data_password: &str) -> ClientBuilder {
    let urls = match sentinel_password {
        Some(password) => group.sentinel_urls_with_password(password),
        None => group.sentinel_urls(),
    };
    Client::builder()
        .redis_sentinel(urls, SERVICE)
        .sentinel_primary_password(Some(PASSWORDS.acl_user.0), data_password)
        .wait_for_replicas(1, Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
}

/// The error `build()` gives, checked to show none of the passwords.
async fn refused(builder: ClientBuilder) -> String {
    let error = builder.build().await.expect_err("a wrong or missing password was accepted");
    let (text, debug) = (error.to_string(), format!("{error:?}"));
    for secret in [PASSWORDS.data, PASSWORDS.acl_user.1, PASSWORDS.sentinel, "wr0ng"] {
        assert!(!text.contains(secret) && !debug.contains(secret), "a password shown: {text} / {debug}");
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_with_sentinel_and_data_node_passwords_and_across_a_failover() {
    // Two replicas: the promoted one still has a replica to acknowledge grants.
    let mut group = SentinelGroup::start_with_passwords(2, &PASSWORDS).await;

    // Wrong or missing passwords: each error names the password to fix.
    let no_sentinel_password = refused(builder(&group, None, PASSWORDS.acl_user.1)).await;
    assert!(no_sentinel_password.contains("the sentinels"), "{no_sentinel_password}");
    assert!(no_sentinel_password.contains("their URLs"), "{no_sentinel_password}");
    let wrong_sentinel_password = refused(builder(&group, Some("wr0ng"), PASSWORDS.acl_user.1)).await;
    assert!(wrong_sentinel_password.contains("their URLs"), "{wrong_sentinel_password}");
    let wrong_data_password = refused(builder(&group, Some(PASSWORDS.sentinel), "wr0ng")).await;
    assert!(wrong_data_password.contains("sentinel_primary_password"), "{wrong_data_password}");
    assert!(!wrong_data_password.contains("their URLs"), "{wrong_data_password}");

    let right = builder(&group, Some(PASSWORDS.sentinel), PASSWORDS.acl_user.1);
    let shown = format!("{right:?}");
    assert!(!shown.contains(PASSWORDS.sentinel) && !shown.contains(PASSWORDS.acl_user.1), "{shown}");
    let client = right.build().await.expect("a client with both passwords");
    let holder = client.lock("guarded:held").ttl(Duration::from_secs(3)).acquire().await.expect("a lock");
    let fence = holder.fencing_token();

    let old = group.primary_port().await.expect("a primary");
    group.servers.iter_mut().find(|s| s.port() == old).expect("the primary").kill();
    eventually(Duration::from_secs(20), "the sentinels switched the primary", || async {
        group.primary_port().await.is_some_and(|port| port != old)
    })
    .await;
    let switched_at = Instant::now();
    // The promoted replica is reached with the same credentials: a lock on another key, then the held one.
    loop {
        match client.lock("guarded:other").try_acquire().await {
            Ok(Some(guard)) => {
                let released = guard.release().await.expect("release after the failover");
                assert_eq!(released, ReleaseOutcome::Released);
                break;
            }
            Ok(None) => panic!("nobody holds guarded:other"),
            Err(e) => {
                assert!(switched_at.elapsed() < Duration::from_secs(10), "calls still fail after the switch: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
    }
    holder.release().await.expect("the holder's release after the failover");
    let again = client.lock("guarded:held").wait(Duration::from_secs(10)).acquire().await.expect("taken again");
    assert!(again.fencing_token() > fence, "fencing went back across the failover");
    again.release().await.expect("release");
}
