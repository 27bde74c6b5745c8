//! The least a fenced cycle by script does on a cluster when locks, one per task, share calls as well as they
//! can (`cluster_cycles coalesced`, and the `--scale-out` cluster rows' bound): one caller per primary takes all
//! of that node's locks in one call (one `TIME`; a token of their own and the record in ARGV each, as
//! distlock's BATCH_SPREAD) and frees them all in the next (`GET`, `SETRANGE` of a freed token), nothing else.
//! One definition for the benchmark and the profiling tool (which includes this file by path).

use redis::cluster_async::ClusterConnection;

/// `coalesced`'s acquires: `ARGV[1]` the lock count n, then n records, then n tokens. Writes a record of
/// distlock's shape (token, fence, grant time, holder).
pub const COALESCED_ACQUIRE: &str =
    "local n = tonumber(ARGV[1]) local t = redis.call('time') local now = t[1] .. t[2] \
     local out = {} for i = 1, n do local R = ARGV[i + 1] local v = redis.call('get', R) \
     redis.call('set', R, ARGV[n + i + 1] .. ':' .. now .. ':' .. now .. ':7:bench', 'px', '10000') out[i] = now end \
     return out";
/// `coalesced`'s releases, arguments as its acquires': a freed token written over each record that is the
/// token's.
pub const COALESCED_RELEASE: &str = "local n = tonumber(ARGV[1]) local out = {} for i = 1, n do local R = ARGV[i + 1] \
     local v = redis.call('get', R) out[i] = 0 \
     if v and string.find(v, ARGV[n + i + 1], 1, true) == 1 then \
     redis.call('setrange', R, '0', '================================') out[i] = 1 end end return out";
/// The coalesced acquire and release scripts, loaded once.
pub struct Scripts {
    acquire: redis::Script,
    release: redis::Script,
}

impl Scripts {
    pub fn load() -> Self {
        Self { acquire: redis::Script::new(COALESCED_ACQUIRE), release: redis::Script::new(COALESCED_RELEASE) }
    }

    /// One call taking all of `keys` (served by one primary, `node`), then one freeing them: `keys.len()`
    /// cycles. `n` makes this round's tokens differ from the last.
    pub async fn cycle(
        &self,
        conn: &mut ClusterConnection,
        node: &str,
        keys: &[String],
        n: u64,
    ) -> redis::RedisResult<u64> {
        let tokens: Vec<String> = (0..keys.len()).map(|k| format!("{node}-{k}-{n}")).collect();
        for script in [&self.acquire, &self.release] {
            let mut call = script.prepare_invoke();
            call.key(&keys[0]).arg(keys.len());
            for key in keys {
                call.arg(key);
            }
            for token in &tokens {
                call.arg(token);
            }
            let _: Vec<redis::Value> = call.invoke_async(conn).await?;
        }
        Ok(keys.len() as u64)
    }
}

/// `count` lock keys grouped by the primary serving each (its address, as `CLUSTER SLOTS` names it).
pub async fn keys_by_node(
    conn: &mut ClusterConnection,
    count: usize,
) -> std::collections::BTreeMap<String, Vec<String>> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
    let slots = conn.route_command(redis::cmd("CLUSTER").arg("SLOTS").clone(), route).await.expect("CLUSTER SLOTS");
    // Each range: [start, end, [host, port, ..], replicas..].
    let ranges: Vec<(i64, i64, (String, i64))> = redis::from_redis_value::<Vec<Vec<redis::Value>>>(slots)
        .expect("slot ranges")
        .into_iter()
        .map(|range| {
            let (start, end) = (redis::from_redis_value(range[0].clone()), redis::from_redis_value(range[1].clone()));
            let primary: Vec<redis::Value> = redis::from_redis_value(range[2].clone()).expect("primary");
            let address = (redis::from_redis_value(primary[0].clone()), redis::from_redis_value(primary[1].clone()));
            (start.expect("start"), end.expect("end"), (address.0.expect("host"), address.1.expect("port")))
        })
        .collect();
    let mut nodes = std::collections::BTreeMap::<String, Vec<String>>::new();
    for k in 0..count {
        let key = format!("coalesced:{k}");
        let slot: i64 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query_async(conn).await.expect("KEYSLOT");
        let (_, _, (host, port)) = ranges.iter().find(|(s, e, _)| (*s..=*e).contains(&slot)).expect("served slot");
        nodes.entry(format!("{host}:{port}")).or_default().push(key);
    }
    nodes
}
