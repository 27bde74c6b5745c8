//! A Redis Cluster's nodes: the calls that serve many locks go to each node as one call, not one per slot.
//!
//! Locks spread over the cluster's 16 384 slots, and a script's declared keys must share one slot, so one call
//! per slot was a call per lock or two. Here the records travel in ARGV (a script without flags may reach keys
//! of any slot its node serves) and one declared key routes the call: RENEW_SPREAD renews every due lock of a
//! node in one call, and each node has a coalescer of its own whose calls are BATCH_SPREAD (acquires and
//! releases). Which node serves a slot comes from `CLUSTER SLOTS`, fetched again after [`NODE_MAP_AGE`]; an
//! operation whose slot moved since fails alone in that call, before writing anything, and goes again in a
//! call of its own (which the cluster client redirects), the map then fetched anew.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;

use super::batch::{call_one, command_spread, Coalescer, Op, Reply, Transport};
use super::link::Link;
use super::scripts::RENEW_SPREAD;
use super::{is_cluster_in_flux, millis, send_script, RedisBackend, RENEWALS_PER_CALL};
use crate::backend::Renewal;
use crate::LockError;

/// How long a fetched slot map is used before it is fetched again.
const NODE_MAP_AGE: Duration = Duration::from_secs(5);
const SLOTS: usize = 16_384;
/// A slot no node serves in the map.
const UNSERVED: u16 = u16::MAX;

/// Which node serves each slot (an index per slot, [`UNSERVED`] for none), as fetched at some instant.
#[derive(Default)]
pub(super) struct NodeMap {
    map: Mutex<Option<(Instant, Arc<Vec<u16>>)>>,
    /// A caller is fetching a fresh map: the others use the last one meanwhile.
    fetching: AtomicBool,
}

impl NodeMap {
    /// The map: the last one fetched, after fetching a fresh one first (through `link`, on `record`'s node)
    /// if it is older than [`NODE_MAP_AGE`] and no other caller is at it. `None` when there is none.
    async fn get(&self, link: &Link, record: &str) -> Option<Arc<Vec<u16>>> {
        let last = self.map.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let fresh = last.as_ref().is_some_and(|(at, _)| at.elapsed() < NODE_MAP_AGE);
        if !fresh && !self.fetching.swap(true, Ordering::AcqRel) {
            let fetched = fetch_node_map(link, record).await;
            self.fetching.store(false, Ordering::Release);
            if let Some(nodes) = fetched {
                *self.map.lock().unwrap_or_else(PoisonError::into_inner) = Some((Instant::now(), Arc::clone(&nodes)));
                return Some(nodes);
            }
        }
        last.map(|(_, nodes)| nodes)
    }

    /// The node that serves `record`'s slot in the last map fetched, without fetching one; without a map (or
    /// for a slot it has no node for), the slot, numbered past every node index.
    pub(super) fn shard_of(&self, record: &str) -> u64 {
        let slot = slot_of(record);
        let last = self.map.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|(_, nodes)| nodes[slot]);
        match last {
            Some(node) if node != UNSERVED => u64::from(node),
            _ => (1 << 16) + slot as u64,
        }
    }

    /// A slot moved: the next caller fetches the map again.
    fn forget(&self) {
        *self.map.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// `CLUSTER SLOTS`, asked of `record`'s node, as a map; `None` if it fails.
async fn fetch_node_map(link: &Link, record: &str) -> Option<Arc<Vec<u16>>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SLOTS");
    let reply: Value = link.query_on_node_of(cmd, record).await.ok()?;
    node_map_of(&reply).map(Arc::new)
}

/// The node index of every slot in a `CLUSTER SLOTS` reply (`[start, end, [ip, port, ...], replicas...]` per
/// range; nodes numbered by their primary's address), or `None` for a reply of another shape.
fn node_map_of(reply: &Value) -> Option<Vec<u16>> {
    let Value::Array(ranges) = reply else { return None };
    let mut nodes = vec![UNSERVED; SLOTS];
    let mut addresses: Vec<(Vec<u8>, i64)> = Vec::new();
    for range in ranges {
        let Value::Array(fields) = range else { return None };
        let [Value::Int(start), Value::Int(end), Value::Array(primary), ..] = fields.as_slice() else { return None };
        let [ip, Value::Int(port), ..] = primary.as_slice() else { return None };
        let ip = match ip {
            Value::BulkString(ip) => ip.clone(),
            Value::SimpleString(ip) => ip.clone().into_bytes(),
            _ => return None,
        };
        let address = (ip, *port);
        let index = match addresses.iter().position(|a| *a == address) {
            Some(i) => i,
            None => {
                addresses.push(address);
                addresses.len() - 1
            }
        };
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        nodes.get_mut(start..=end)?.fill(u16::try_from(index).ok()?);
    }
    Some(nodes)
}

/// The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, modulo 16 384. Every record's hash tag is
/// `{<escaped key>}`, its only braces (see `LockKeys`), so the tag is what lies between the first `{` and the
/// `}` after it, as Redis takes it.
fn slot_of(key: &str) -> usize {
    let key = key.as_bytes();
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    usize::from(crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key))) % SLOTS
}

impl RedisBackend {
    /// The renewals on a cluster: one RENEW_SPREAD call per node (and per [`RENEWALS_PER_CALL`] locks), all
    /// at once; the locks those calls could not renew (a slot moved, the map could not be fetched) go to one
    /// RENEW_MANY call per slot.
    pub(super) async fn renew_on_cluster(&self, items: &[Renewal<'_>]) -> Vec<Result<bool, LockError>> {
        let Some(first) = items.first() else { return Vec::new() };
        let Some(nodes) = self.node_map.get(&self.commands, &first.keys.record).await else {
            return self.renew_by_slot(items).await;
        };
        let mut by_node: HashMap<u16, Vec<usize>> = HashMap::new();
        let mut unserved = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match nodes[slot_of(&item.keys.record)] {
                UNSERVED => unserved.push(i),
                node => by_node.entry(node).or_default().push(i),
            }
        }
        let calls = by_node
            .into_values()
            .flat_map(|indices| indices.chunks(RENEWALS_PER_CALL).map(<[usize]>::to_vec).collect::<Vec<_>>())
            .map(|indices| self.renew_spread(items, indices));
        let mut renewed: Vec<Option<Result<bool, LockError>>> = items.iter().map(|_| None).collect();
        let mut again = unserved;
        for (indices, results) in futures_util::future::join_all(calls).await {
            for (i, result) in indices.into_iter().zip(results) {
                match result {
                    Ok(outcome) => renewed[i] = Some(Ok(outcome)),
                    // Not this node's (any more), or the call failed: its slot's own call decides.
                    Err(_) => again.push(i),
                }
            }
        }
        if !again.is_empty() {
            self.node_map.forget();
            let retry: Vec<Renewal<'_>> = again.iter().map(|&i| items[i]).collect();
            for (i, result) in again.into_iter().zip(self.renew_by_slot(&retry).await) {
                renewed[i] = Some(result);
            }
        }
        renewed
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(LockError::InvalidConfig("renewal not sent".into()))))
            .collect()
    }

    /// One RENEW_SPREAD call for `indices` (locks of one node), routed by the first one's record.
    async fn renew_spread(
        &self,
        items: &[Renewal<'_>],
        indices: Vec<usize>,
    ) -> (Vec<usize>, Vec<Result<bool, LockError>>) {
        self.renewal_call(items, indices, |indices, sending| {
            let mut cmd = Cmd::with_capacity(5 + 3 * indices.len(), 96 * indices.len());
            sending.call(&mut cmd, &RENEW_SPREAD);
            cmd.arg(1).arg(&items[indices[0]].keys.record);
            for &i in indices {
                cmd.arg(&items[i].keys.record).arg(items[i].token.as_str()).arg(millis(items[i].ttl));
            }
            cmd
        })
        .await
    }
}

/// The cluster connection as one node's transport: its calls are BATCH_SPREAD, routed by their first record.
pub(super) struct NodeLink(Link);

impl Transport for NodeLink {
    async fn call(&self, ops: &[Op<'_>]) -> redis::RedisResult<Value> {
        send_script(&mut self.0.clone(), |sending| command_spread(ops, sending)).await
    }
}

/// Acquires and releases on a cluster: a coalescer per node, as one server has one.
pub(super) struct PerNode {
    link: Link,
    nodes: Arc<NodeMap>,
    coalescers: Mutex<HashMap<u16, Arc<Coalescer<NodeLink>>>>,
}

impl PerNode {
    pub(super) fn new(link: Link, nodes: Arc<NodeMap>) -> Self {
        Self { link, nodes, coalescers: Mutex::default() }
    }

    /// Runs `op` through its node's coalescer; in a call of its own when the slot map is not known, or when
    /// the node's call found the record elsewhere (the slot moved; nothing was written for it).
    pub(super) async fn run(&self, op: &Op<'_>) -> Reply {
        let Some(nodes) = self.nodes.get(&self.link, op.record()).await else {
            return call_one(&self.link, op).await;
        };
        let node = nodes[slot_of(op.record())];
        if node == UNSERVED {
            return call_one(&self.link, op).await;
        }
        let coalescer = {
            let mut coalescers = self.coalescers.lock().unwrap_or_else(PoisonError::into_inner);
            let made = coalescers.entry(node).or_insert_with(|| Coalescer::new(NodeLink(self.link.clone())));
            Arc::clone(made)
        };
        match coalescer.run(op).await {
            Err(e) if is_cluster_in_flux(&e) => {
                self.nodes.forget();
                call_one(&self.link, op).await
            }
            reply => reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ip: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(ip.into()), Value::Int(port), Value::BulkString(b"id".to_vec())])
    }

    /// The slots Redis gives these keys (`CLUSTER KEYSLOT`, redis-server 7.0).
    #[test]
    fn slots_are_the_servers() {
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
        // The redis crate's own slot, for many keys, braces included (its number shows only in Debug).
        for key in ["a", "distlock:{x}", "p:{{}}", "{}{a}", "{a}{b}", "x{", "}{y}", "{\u{e9}t\u{e9}}", "k:12345"] {
            let crate_slot = format!("{:?}", redis::cluster_routing::Slot::for_key(key));
            assert_eq!(crate_slot, format!("Slot({})", slot_of(key)), "{key}");
        }
        assert_eq!(slot_of("distlock:{report:42}"), slot_of("report:42"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
    }

    #[test]
    fn a_slots_reply_maps_every_slot_to_its_primary() {
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("127.0.0.1", 7000), node("127.0.0.1", 7003)]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node("127.0.0.1", 7001)]),
            Value::Array(vec![Value::Int(10923), Value::Int(16000), node("127.0.0.1", 7000)]),
        ]);
        let nodes = node_map_of(&reply).expect("a map");
        assert_eq!((nodes[0], nodes[5460], nodes[5461], nodes[10922]), (0, 0, 1, 1));
        assert_eq!((nodes[10923], nodes[16000]), (0, 0), "a second range of the first primary");
        assert_eq!(nodes[16001], UNSERVED);
        assert_eq!(node_map_of(&Value::Int(1)), None);
        let out_of_range =
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(20000), node("127.0.0.1", 7000)])]);
        assert_eq!(node_map_of(&out_of_range), None);
    }
}
