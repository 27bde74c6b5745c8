//! The production scripts' calls, with realistic and hostile arguments, and the ad-hoc scripts.

use super::{Check, Generator, Step, HOLDERS, KEYS, RECORDS, TTLS, VALUES};

/// The clients' ids a queued attempt names (its mark `R:client:<id>` keeps its places alive).
const CLIENTS: [&str; 2] = ["00000000000000c1", "00000000000000c2"];

/// The ad-hoc scripts: the conversions both ways, `redis.*`, errors, globals, writes before a failure.
const SNIPPETS: [&str; 67] = [
    "return {1, 2.9, -2.9, 'x', false, true, {ok='fine'}, {err='E bad'}, nil, 4}",
    "return 1e20",
    "return -7.99",
    "return redis.call('get', KEYS[1])",
    "return redis.pcall('zadd', KEYS[1], 'x', 'm')",
    "return redis.pcall('zadd', KEYS[1], 1, 'm')",
    "return redis.pcall('nosuch')",
    "return redis.pcall('get')",
    "return redis.pcall('eval', 'return 1', 0)",
    "return redis.error_reply('oops')",
    "return redis.error_reply('MY bad')",
    "return redis.status_reply('FINE')",
    "return redis.status_reply(5)",
    "return redis.sha1hex(ARGV[1] or '')",
    "x = 1",
    "return undefined_global",
    "string.upper = nil",
    "redis.call('set', KEYS[1], 'before') return redis.call('nosuch')",
    "redis.call('set', KEYS[1], 'before') error('boom')",
    "local ok, e = pcall(redis.call, 'zadd', KEYS[1], 'x', 'y') return {tostring(ok), e}",
    "local ok, e = pcall(error, {err='MINE x'}) return e",
    "return {redis.call('zadd', KEYS[1], 1.5, 'a'), redis.call('zrange', KEYS[1], 0, -1, 'withscores')}",
    "return redis.call('zscore', KEYS[1], 'a')",
    "return redis.call('zpopmin', KEYS[1], 2)",
    "return redis.call('exists', KEYS[1], KEYS[1], 'nokey')",
    "return redis.call('ping')",
    "redis.setresp(3) return redis.call('zrange', KEYS[1], 0, -1, 'withscores')",
    "redis.setresp(3) return redis.call('get', 'no such key') == nil",
    "redis.setresp(3) return {true, false, redis.call('zscore', KEYS[1], 'a')}",
    "return redis.call('set', KEYS[1], 'v', 'px', 0)",
    "return {#KEYS, #ARGV, ARGV[1], KEYS[1]}",
    "return {double=1.5}",
    "return redis.log(redis.LOG_WARNING, 'x')",
    "redis.log(9, 'x')",
    "return redis.REDIS_VERSION",
    "return pcall(redis.call, 'get', KEYS[1])",
    "return redis.call('getrange', KEYS[1], 0, -1)",
    "return redis.call('del', KEYS[1], KEYS[1])",
    "local function f() return redis.call('zcard', KEYS[1]) end return f() + 1",
    "return 1 +",
    "return redis.call('SET', KEYS[1], 'x', 'GET')",
    "return redis.pcall('set', KEYS[1], true)",
    "return redis.pcall('script', 'flush')",
    "return redis.error_reply('-NEG x')",
    "return redis.sha1hex(5)",
    "return {map={a=1}}",
    "return {set={b=true}}",
    "redis.setresp(4)",
    "return {err=5}",
    "return pcall(error)",
    "error(redis.error_reply('MINE y'))",
    "return redis.call('get', KEYS[1], 'extra')",
    "local ok, e = pcall(redis.call, 'get') return e",
    "return redis.call()",
    "return {redis.acl_check_cmd('get', 'x'), redis.breakpoint(), redis.replicate_commands()}",
    "return redis.acl_check_cmd('nosuch')",
    "redis.set_repl(redis.REPL_ALL) return redis.REDIS_VERSION_NUM",
    "return {math.huge, -0.5, -math.huge}",
    "return type(getfenv)",
    "return {type(loadstring), type(gcinfo), type(unpack), type(load), type(coroutine.wrap), _VERSION}",
    // Tables read as arrays: built out of order, with holes, other keys, and the reply fields beside items.
    "local t = {} t[3] = 'c' t[1] = 'a' t[2] = 'b' t[5] = 'e' return t",
    "return {[0] = 'zero', [-1] = 'neg', [1.5] = 'half', 'one', foo = 'bar', [2] = 'two'}",
    "local t = {'a', 'b', 'c'} t[2] = nil return t",
    "return {1, 2, err = 'E beside items'}",
    "return {1, ok = 'beside items', map = {k = 1}}",
    "return setmetatable({}, {__index = function(_, k) if k == 1 or k == 2 then return k * 10 end end})",
    "redis.call('zadd', 'zz', 0.1, 'q', 1e20, 'r', 1/3, 's', -2.5e-7, 't', 1700000000123456, 'u') \
     return {redis.call('zrange', 'zz', 0, -1, 'withscores'), redis.call('zscore', 'zz', 's')}",
];

impl Generator {
    /// A production script call.
    pub(super) fn script_step(&mut self) -> Step {
        // Mostly the scripts that change locks; every script now and then.
        let weights: &[(&str, u8)] = &[
            ("ACQUIRE", 30),
            ("RELEASE", 16),
            ("BATCH", 10),
            ("ACQUIRE_PLAIN", 5),
            ("ACQUIRE_ALL", 5),
            ("RENEW", 5),
            ("RENEW_MANY", 4),
            ("WITHDRAW", 5),
            ("INFO", 5),
            ("WAITERS", 4),
            ("REMAINING", 3),
            ("FORCE_UNLOCK", 3),
            ("BATCH_SPREAD", 3),
            ("RENEW_SPREAD", 2),
        ];
        let mut roll = self.rng.u8(..weights.iter().map(|w| w.1).sum::<u8>());
        let name = weights
            .iter()
            .find(|(_, w)| {
                roll < *w || {
                    roll -= w;
                    false
                }
            })
            .map_or("ACQUIRE", |w| w.0);
        let variant = ["", " numbered", " sharded"][self.rng.usize(..3)];
        let (keys, mut argv, mut check) = self.script_args(name);
        if !variant.is_empty() {
            self.calls += 1;
            argv.push(self.calls.to_string());
            // The numbered frame replies {call, reply}.
            let under = |paths: Vec<Vec<usize>>| paths.into_iter().map(|p| [vec![1], p].concat()).collect();
            check = Check { ms: under(check.ms), us: under(check.us), ..Check::default() };
        }
        // Sometimes a script cut short: its last arguments left out.
        if self.rng.u8(..100) < 6 && !argv.is_empty() {
            let keep = self.rng.usize(..argv.len());
            argv.truncate(keep);
        }
        let full = format!("{name}{variant}");
        let index = self.scripts.iter().position(|s| s.name == full).unwrap_or_else(|| panic!("no script {full}"));
        let (sha, source) = (self.scripts[index].sha.clone(), self.scripts[index].source);
        let by_sha = if self.loaded.contains(&sha) { self.rng.u8(..100) < 80 } else { self.rng.u8(..100) < 25 };
        let mut args: Vec<Vec<u8>> = vec![
            if by_sha { b"EVALSHA".to_vec() } else { b"EVAL".to_vec() },
            if by_sha { sha.clone().into_bytes() } else { source.as_bytes().to_vec() },
            keys.len().to_string().into_bytes(),
        ];
        args.extend(keys.into_iter().map(String::into_bytes));
        args.extend(argv.into_iter().map(String::into_bytes));
        if !by_sha {
            self.loaded.insert(sha);
        }
        Step { args, check, what: full }
    }

    /// KEYS, ARGV and the clock-dependent parts of the reply of one call of script `name`.
    fn script_args(&mut self, name: &str) -> (Vec<String>, Vec<String>, Check) {
        let record = |g: &mut Self| g.pick(&RECORDS).to_owned();
        let mut check = Check::default();
        let s = |v: &str| v.to_owned();
        let (keys, argv) = match name {
            "ACQUIRE" => {
                check.ms.push(vec![2]);
                let mut argv = vec![s(self.acquire_token()), s(self.field(&TTLS)), s(self.field(&HOLDERS))];
                if self.rng.bool() {
                    argv.extend([
                        s(self.field(&["30000", "90000"])),
                        s(self.field(&["20000", "40000"])),
                        s(self.field(&["1", "2", "9"])),
                        s(self.field(&CLIENTS)),
                        s(self.field(&["90000", "120000"])),
                    ]);
                }
                (vec![record(self)], argv)
            }
            "ACQUIRE_PLAIN" => {
                check.ms.extend([vec![1], vec![2]]);
                let mark = s(self.pick(&["mark", "mark", "{a}", "{a}:queue"]));
                (vec![record(self)], vec![s(self.acquire_token()), s(self.field(&TTLS)), s(self.field(&HOLDERS)), mark])
            }
            "ACQUIRE_ALL" => {
                let mut keys: Vec<String> = RECORDS.iter().map(|r| s(r)).filter(|_| self.rng.bool()).collect();
                if keys.is_empty() || self.rng.u8(..10) == 0 {
                    keys.push(record(self));
                }
                let mut argv = vec![s(self.field(&TTLS)), s(self.field(&HOLDERS))];
                argv.extend((0..keys.len()).map(|_| s(self.acquire_token())));
                (keys, argv)
            }
            "RELEASE" => {
                let mut argv = vec![s(self.token()), self.release_fence()];
                match self.rng.u8(..6) {
                    0 => argv.push(s(self.field(&["0", "30000", "90000"]))),
                    1 => argv.extend([s(self.field(&["0", "30000"])), s("1")]),
                    _ => {}
                }
                (vec![record(self)], argv)
            }
            "BATCH" | "BATCH_SPREAD" => return self.batch_args(name == "BATCH_SPREAD"),
            "RENEW" => (vec![record(self)], vec![s(self.token()), s(self.field(&TTLS))]),
            "RENEW_MANY" => {
                let keys: Vec<String> = (0..self.rng.usize(1..4)).map(|_| record(self)).collect();
                let argv = keys.iter().flat_map(|_| [s(self.token()), s(self.field(&TTLS))]).collect::<Vec<_>>();
                (keys, argv)
            }
            "RENEW_SPREAD" => {
                let argv = (0..self.rng.usize(1..4))
                    .flat_map(|_| [record(self), s(self.token()), s(self.field(&TTLS))])
                    .collect::<Vec<_>>();
                (vec![record(self)], argv)
            }
            "WITHDRAW" => {
                check.ms.push(vec![1]);
                (vec![record(self)], vec![s(self.token())])
            }
            "REMAINING" => {
                check.ms.push(vec![]);
                (vec![record(self)], vec![s(self.token())])
            }
            "INFO" => {
                check.us.push(vec![2]);
                check.ms.push(vec![3]);
                (vec![record(self)], vec![])
            }
            "FORCE_UNLOCK" => (vec![record(self)], vec![s(self.pick(&["wake", "*"]))]),
            "WAITERS" => {
                for i in 0..8 {
                    check.us.push(vec![i, 1]);
                    check.ms.push(vec![i, 2]);
                }
                (vec![record(self)], vec![s(self.field(&["1", "3", "10"]))])
            }
            other => panic!("no arguments for {other}"),
        };
        (keys, argv, check)
    }

    /// BATCH's (or BATCH_SPREAD's) KEYS and ARGV: one to five operations of any kind, now and then an unknown
    /// one.
    /// A release's fencing token of its grant: unknown (empty), or one no grant here has (the records' fences
    /// are the clock's µs, which the sequences cannot know ahead).
    fn release_fence(&mut self) -> String {
        self.field(&["", "", "0", "1700000000000000"]).into()
    }

    fn batch_args(&mut self, spread: bool) -> (Vec<String>, Vec<String>, Check) {
        let ops: String = (0..self.rng.usize(1..6))
            .map(|_| self.pick(&["a", "a", "b", "p", "q", "r", "r", "k", "s", "x"]).to_owned())
            .collect();
        let mut check = Check::default();
        let (mut records, mut args) = (Vec::new(), Vec::new());
        for (i, op) in ops.chars().enumerate() {
            check.ms.push(vec![i, 2]);
            records.push(self.pick(&RECORDS).to_owned());
            let token = if "abpq".contains(op) { self.acquire_token() } else { self.token() }.to_owned();
            match op {
                'a' => args.extend([token, self.field(&TTLS).into(), self.field(&HOLDERS).into()]),
                'b' => args.push(token),
                'r' => args.extend([token, self.release_fence()]),
                'p' => {
                    check.ms.push(vec![i]);
                    args.extend([token, self.field(&TTLS).into(), self.field(&HOLDERS).into(), "mark".into()]);
                }
                'q' => args.extend([
                    token,
                    self.field(&TTLS).into(),
                    self.field(&HOLDERS).into(),
                    self.field(&["30000", "90000"]).into(),
                    self.field(&["20000", "40000"]).into(),
                    self.field(&["1", "7"]).into(),
                    self.field(&CLIENTS).into(),
                    self.field(&["90000", "120000"]).into(),
                ]),
                'k' => args.extend([token, self.release_fence(), self.field(&["0", "30000", "90000"]).into()]),
                's' => args.extend([token, self.release_fence(), self.field(&["0", "30000"]).into(), "1".into()]),
                _ => {}
            }
        }
        let mut argv = vec![ops];
        if spread {
            let first = records[0].clone();
            argv.extend(records);
            argv.extend(args);
            (vec![first], argv, check)
        } else {
            argv.extend(args);
            (records, argv, check)
        }
    }

    /// An ad-hoc script, by EVAL.
    pub(super) fn snippet_step(&mut self) -> Step {
        let snippet = self.pick(&SNIPPETS);
        let key = self.pick(&KEYS);
        let arg = self.pick(&VALUES);
        let mut step = Step::raw(&["EVAL", snippet, "1", key, arg]);
        step.what = "snippet".into();
        step
    }
}
