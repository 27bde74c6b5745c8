//! The `distlock` binary against a private PostgreSQL server (`--postgres URL`): migrate, ls, show and release
//! see and free what the library's clients hold there.

mod common;

use common::{assert_exit, assert_one_error_line, distlock, stdout, TTL};
use distlock_tests::PostgresServer;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_show_and_release_work_on_postgres_and_migrate_makes_a_named_schema() {
    let server = tokio::task::spawn_blocking(PostgresServer::new).await.expect("postgres");
    let url = server.url();

    // `migrate` makes a schema of the given name; a client naming it then finds it ready.
    let migrated = distlock(&["--postgres", &url, "--schema", "ops_locks", "migrate"], None).await;
    assert_exit(&migrated, 0);
    assert!(stdout(&migrated).contains("ops_locks"), "{}", stdout(&migrated));
    assert_eq!(server.psql("SELECT ops_locks.schema_version()"), "2");

    let client = distlock::Client::builder().postgres(&url).owner("web-3").build().await.expect("client");
    let report = client.lock("report:1").ttl(TTL).metadata("monthly").acquire().await.expect("acquire");
    let _invoice = client.lock("invoice:{7}").ttl(TTL).acquire().await.expect("acquire");

    let listed = distlock(&["--postgres", &url, "ls", "--json"], None).await;
    assert_exit(&listed, 0);
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("ls --json is JSON");
    let keys: Vec<&str> = listed.as_array().expect("an array").iter().map(|e| e["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["invoice:{7}", "report:1"], "sorted, and not the client's startup check");
    let entry = &listed[1];
    assert_eq!((entry["owner"].as_str(), entry["metadata"].as_str()), (Some("web-3"), Some("monthly")));
    assert_eq!(entry["fencing_token"], report.fencing_token());

    let shown = distlock(&["--postgres", &url, "show", "report:1"], None).await;
    assert_exit(&shown, 0);
    assert!(stdout(&shown).contains("web-3") && stdout(&shown).contains("monthly"), "{}", stdout(&shown));

    let released = distlock(&["--postgres", &url, "release", "report:1", "--yes"], None).await;
    assert_exit(&released, 0);
    assert!(client.lock_info("report:1").await.expect("lock_info").is_none(), "released by the tool");
    assert!(client.lock_info("invoice:{7}").await.expect("lock_info").is_some(), "the other lock stays");

    // In another schema there are no locks: the tool reads the one it is told to.
    let elsewhere = distlock(&["--postgres", &url, "--schema", "ops_locks", "ls", "--json"], None).await;
    assert_exit(&elsewhere, 0);
    assert_eq!(serde_json::from_slice::<Value>(&elsewhere.stdout).unwrap(), serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_usage_errors_are_one_line() {
    let no_url = distlock(&["migrate"], None).await;
    assert_exit(&no_url, 2);
    assert!(assert_one_error_line(&no_url).contains("--postgres"));

    let bad_schema = distlock(&["--postgres", "postgres://u@127.0.0.1:1/x", "--schema", "Bad-Name", "ls"], None).await;
    let line = assert_one_error_line(&bad_schema);
    assert!(line.contains("schema name") && line.contains("lower-case"), "{line}");
}
