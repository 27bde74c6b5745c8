//! The raw floor's release script and the least fenced cycle's two scripts, one definition for the benchmark and its profiling tools (which include
//! this file by path), so every floor they measure runs the same script.

/// Compare-and-delete: the raw release.
pub const RAW_RELEASE: &str = r"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0";

/// The least a fenced grant by script does: read the record (its last token), the server's clock, write. It
/// checks nothing (not even that the lock is free), so it bounds what any fenced grant by script costs Redis.
pub const FENCED_ACQUIRE: &str = "local v = redis.call('get', KEYS[1]) local t = redis.call('time') \
     redis.call('set', KEYS[1], ARGV[1] .. ':' .. t[1] .. t[2], 'px', ARGV[2]) return 1";

/// The least a release that keeps the last token does: check the owner, leave a freed record.
pub const FENCED_RELEASE: &str = "local v = redis.call('get', KEYS[1]) \
     if v and string.find(v, ARGV[1], 1, true) == 1 then redis.call('set', KEYS[1], 'freed', 'keepttl') return 1 end \
     return 0";
