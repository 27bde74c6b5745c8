//! Raw commands: every command the simulated server knows, with random options, valid or not.

use super::{Check, Generator, Step, KEYS, TOKENS, TTLS, VALUES};

impl Generator {
    /// A raw command: any the simulated server knows, with random options, valid or not.
    pub(super) fn raw_step(&mut self) -> Step {
        let k = self.pick(&KEYS);
        let k2 = self.pick(&KEYS);
        let v = self.pick(&VALUES);
        let member = self.pick(&["a", "b", "c", TOKENS[0]]);
        let score = |g: &mut Self| {
            g.pick(&[
                "1",
                "2.5",
                "-3",
                "1700000000123456",
                "inf",
                "-inf",
                "+inf",
                "1e3",
                "0x10",
                "abc",
                "nan",
                " 1",
                "",
                "1.5e308",
                "0.1",
            ])
        };
        let args: Vec<&str> = match self.rng.u8(..30) {
            0 => vec!["GET", k],
            1 => vec!["GETDEL", k],
            2 => vec!["TYPE", k],
            3 => return Step { check: Check { ms: vec![vec![]], ..Check::default() }, ..Step::raw(&["PTTL", k]) },
            4 => vec!["DEL", k, k2, k],
            5 => vec!["EXISTS", k, k2, k],
            6 => vec!["ZCARD", k],
            7 => vec!["ZSCORE", k, member],
            8 => vec!["ZREM", k, member, self.pick(&["a", "b"])],
            9 => vec!["ECHO", v],
            10 => [vec!["PING"], vec![v; self.rng.usize(..3)]].concat(),
            11 => return Step { check: Check { time: true, ..Check::default() }, ..Step::raw(&["TIME"]) },
            12..=15 => {
                let mut args = vec!["SET", k, v];
                for _ in 0..self.rng.usize(..4) {
                    match self.rng.u8(..12) {
                        0 => args.push("NX"),
                        1 => args.push("XX"),
                        2 => args.push("GET"),
                        3 => args.push("KEEPTTL"),
                        4 => args.extend(["EX", self.pick(&["30", "100", "0", "-5", "abc", "9223372036854775807"])]),
                        5 | 6 => {
                            args.extend(["PX", self.pick(&["30000", "90000", "0", "-5", "abc", "9223372036854775807"])])
                        }
                        7 => args.extend(["EXAT", self.pick(&["4102444800", "1000", "0"])]),
                        8 => args.extend(["PXAT", self.pick(&["4102444800000", "1000", "-1"])]),
                        9 => args.push("px"),
                        10 => args.push("FOO"),
                        _ => args.push("get"),
                    }
                }
                args
            }
            // Ranges never cut through a µs time in a value (records, R:last, the lock-state mark hold them):
            // what such a cut leaves depends on the µs the time was read at.
            16 => {
                let key = self.pick(&["s1", "z1", KEYS[6]]);
                vec!["SETRANGE", key, self.pick(&["0", "3", "40", "-1", "abc", "536870912"]), v]
            }
            // (A range may start only at the value's start: a record key may hold the lock-state mark, all digits
            // of a time, when ACQUIRE_PLAIN is given it as its mark.)
            17 => vec!["GETRANGE", k, self.pick(&["0", "-1000", "abc"]), self.pick(&["-1", "31", "32", "100", "abc"])],
            18 | 19 => {
                let mut args =
                    vec!["PEXPIRE", k, self.pick(&["30000", "90000", "0", "-1", "abc", "9223372036854775807"])];
                for _ in 0..self.rng.usize(..3) {
                    args.push(self.pick(&["NX", "XX", "GT", "LT", "nx", "FOO"]));
                }
                args
            }
            20 | 21 => {
                let mut args = vec!["ZADD", k];
                for _ in 0..self.rng.usize(..3) {
                    args.push(self.pick(&["NX", "XX", "GT", "LT", "CH", "INCR"]));
                }
                for _ in 0..self.rng.usize(1..4) {
                    args.extend([score(self), self.pick(&["a", "b", "c", TOKENS[1]])]);
                }
                if self.rng.u8(..10) == 0 {
                    args.pop();
                }
                args
            }
            22 | 23 => {
                let (by, bounds): (Option<&str>, [&str; 7]) = match self.rng.u8(..3) {
                    0 => (None, ["0", "-1", "1", "5", "-100", "abc", "2"]),
                    1 => (Some("BYSCORE"), ["-inf", "+inf", "(1", "2.5", "1700000000000000", "abc", "(abc"]),
                    _ => (Some("BYLEX"), ["-", "+", "[a", "(b", "c", "[b", "(a"]),
                };
                let mut args = vec!["ZRANGE", k, self.pick(&bounds), self.pick(&bounds)];
                args.extend(by);
                if self.rng.bool() {
                    args.push("REV");
                }
                if self.rng.u8(..4) == 0 {
                    args.extend(["LIMIT", self.pick(&["0", "1", "-1"]), self.pick(&["1", "2", "-1", "0"])]);
                }
                if self.rng.bool() {
                    args.push("WITHSCORES");
                }
                args
            }
            24 => {
                [vec!["ZPOPMIN", k], vec![self.pick(&["1", "2", "0", "-1", "abc", "10"]); self.rng.usize(..3)]].concat()
            }
            25 => {
                let publish = Step::raw(&[self.pick(&["PUBLISH", "SPUBLISH"]), k, v]);
                return Step { check: Check { receivers: true, ..Check::default() }, ..publish };
            }
            26 => {
                let script = &self.scripts[self.rng.usize(..self.scripts.len())];
                let (source, sha) = (script.source, script.sha.clone());
                match self.rng.u8(..9) {
                    0 | 1 => {
                        self.loaded.insert(sha);
                        return Step::bytes(
                            vec![b"SCRIPT".to_vec(), b"LOAD".to_vec(), source.as_bytes().to_vec()],
                            Check::default(),
                        );
                    }
                    2 => {
                        let upper = sha.to_uppercase();
                        return Step::raw(&[
                            "SCRIPT",
                            "EXISTS",
                            &sha,
                            "0000000000000000000000000000000000000000",
                            &upper,
                        ]);
                    }
                    3 => {
                        self.loaded.clear();
                        vec!["SCRIPT", "FLUSH"]
                    }
                    4 => {
                        let mode = self.pick(&["ASYNC", "sync", "now"]);
                        if mode != "now" {
                            self.loaded.clear();
                        }
                        vec!["SCRIPT", "FLUSH", mode]
                    }
                    5 => vec!["SCRIPT", "LOAD", "return 1 +"],
                    6 => vec!["SCRIPT"],
                    7 => vec!["SCRIPT", self.pick(&["KILL", "nosuch"])],
                    _ => return Step::raw(&["EVALSHA", &sha.to_uppercase(), "1", k]),
                }
            }
            27 => match self.rng.u8(..5) {
                0 => vec!["EVALSHA", "0000000000000000000000000000000000000000", "0"],
                1 => vec!["EVALSHA", "abc", "0"],
                2 => vec!["EVAL", "return 1", self.pick(&["-1", "abc", "3", "1"])],
                3 => vec!["EVAL", "return KEYS[1]", "1"],
                _ => vec!["EVAL"],
            },
            28 => match self.rng.u8(..8) {
                0 => vec!["FOO", "a", "b"],
                1 => vec!["GET"],
                2 => vec!["GET", k, k2],
                3 => vec!["ZADD", k, "1"],
                // SCAN's refusals (its cursors are not Redis's; whole iterations are compared after the sequence).
                4 => vec!["SCAN", self.pick(&["x", " 1", "1 ", "18446744073709551616"])],
                5 => vec!["SCAN", "0", "COUNT", self.pick(&["0", "-1", "abc"])],
                6 => vec!["SCAN", "0", self.pick(&["MATCH", "FOO", "TYPE"])],
                _ => vec!["SCAN", "0", "COUNT", "5", "MATCH"],
            },
            _ => vec!["SET", k, v, "PX", self.pick(&TTLS)],
        };
        let mut step = Step::raw(&args);
        // Now and then in another case, as clients may send them.
        if self.rng.u8(..8) == 0 {
            step.args[0].make_ascii_lowercase();
        }
        step
    }
}
