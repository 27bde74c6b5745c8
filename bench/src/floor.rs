//! The raw floor's release script, one definition for the benchmark and its profiling tools (which include
//! this file by path), so every floor they measure runs the same script.

/// Compare-and-delete: the raw release.
pub const RAW_RELEASE: &str = r"if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0";
