//! Numbered script calls, on a connection that also carries subscriptions: each call of one of our scripts
//! carries a number, its script hands it back beside its reply, and a reply is used only by the call whose
//! number it carries. [`Link`](super::link::Link) sends them; this module builds them and reads their replies.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Arg, Cmd, Pipeline, RedisError, RedisResult, Value};

use super::scripts::{self, Frame};

/// On a connection that also carries subscriptions, script calls are numbered: each carries its number as its
/// last argument, and its script (in the call-number frame, scripts.rs `CALL_FRAME`) hands the number back
/// beside its reply. A reply is used only by the call whose number it
/// carries; any other is an error, and the connection is replaced. Why: on a cluster, the redis crate's
/// connection carries the subscriptions too, and during a live slot migration a subscription's confirmation
/// was seen arriving as the reply to a script call, after which every reply on that node's connection went
/// to the call after its own — a waiter received another's grant, and two tasks held one lock.
static CALLS: AtomicU64 = AtomicU64::new(1);

/// `cmd` as a numbered call of the same script (its variant in `frame`: on a cluster's, the one that announces
/// with SPUBLISH), if it is a call of one of our scripts, and its number. Script calls are built in their frame
/// (`Sending::call`); this numbers what is not, such as a pipeline's calls.
pub(super) fn numbered(cmd: &Cmd, frame: Frame) -> Option<(Cmd, String)> {
    let mut args = cmd.args_iter();
    let (Some(Arg::Simple(name)), Some(Arg::Simple(script))) = (args.next(), args.next()) else { return None };
    let variant = if name.eq_ignore_ascii_case(b"EVALSHA") {
        let ours = scripts::all_scripts().into_iter().find(|s| s.sha.as_bytes() == script);
        ours.map(|s| s.sent_as(Some(frame)).0.as_bytes())
    } else if name.eq_ignore_ascii_case(b"EVAL") {
        let ours = scripts::all_scripts().into_iter().find(|s| s.source.as_bytes() == script);
        ours.map(|s| s.sent_as(Some(frame)).1.as_bytes())
    } else {
        None
    }?;
    let call = next_call();
    let mut numbered = Cmd::with_capacity(cmd.args_iter().len() + 1, 0);
    numbered.arg(name).arg(variant);
    for arg in args {
        let Arg::Simple(arg) = arg else { return None };
        numbered.arg(arg);
    }
    numbered.arg(&call);
    Some((numbered, call))
}

/// A new call's number, as it is sent.
pub(super) fn next_call() -> String {
    CALLS.fetch_add(1, Ordering::Relaxed).to_string()
}

/// The script's own reply, if `reply` answers `call`.
fn answer_to(call: &str, reply: Value) -> Option<Value> {
    match reply {
        Value::Array(mut items) if items.first().is_some_and(|c| is_call(c, call)) => {
            Some(if items.len() > 1 { items.swap_remove(1) } else { Value::Nil })
        }
        _ => None,
    }
}

/// A numbered call's outcome from the connection's `reply` to it: its script's own reply or error, or an
/// out-of-step error when the reply answers another call. A whole-call error (NOSCRIPT, say, or the script
/// raised) is the call's own, except CROSSSLOT ([`answers_another_command`]).
pub(super) fn reply_to(call: &str, reply: Value) -> RedisResult<Value> {
    match reply {
        Value::ServerError(e) if answers_another_command(&e) => Err(out_of_step_error()),
        error @ Value::ServerError(_) => Ok(error),
        reply => match answer_to(call, reply) {
            Some(Value::ServerError(e)) => Err(e.into()),
            Some(own) => Ok(own),
            None => Err(out_of_step_error()),
        },
    }
}

/// `pipeline` with each call of our scripts numbered ([`numbered`]), and each command's number (`None` for a
/// command left as it was); `None` if it calls none of our scripts.
pub(super) fn numbered_pipeline(pipeline: &Pipeline, frame: Frame) -> Option<(Pipeline, Vec<Option<String>>)> {
    let mut numbered_pipeline = redis::pipe();
    let mut calls = Vec::new();
    for c in pipeline.cmd_iter() {
        match numbered(c, frame) {
            Some((numbered, call)) => {
                numbered_pipeline.add_command(numbered);
                calls.push(Some(call));
            }
            None => {
                numbered_pipeline.add_command(c.clone());
                calls.push(None);
            }
        }
    }
    calls.iter().any(Option::is_some).then_some((numbered_pipeline, calls))
}

/// The pipeline's outcomes from its `replies`, which answer `calls` from `offset` on: an out-of-step error
/// for all of them if any reply answers another call, since it then says nothing of this one's.
pub(super) fn replies_to(calls: &[Option<String>], offset: usize, replies: Vec<Value>) -> RedisResult<Vec<Value>> {
    replies
        .into_iter()
        .zip(calls.iter().skip(offset))
        .map(|(reply, call)| match (call, reply) {
            (Some(_), Value::ServerError(e)) if answers_another_command(&e) => Err(out_of_step_error()),
            // A call that failed as a whole (NOSCRIPT, say) is its own error; `ignore_errors` hands it on.
            (_, error @ Value::ServerError(_)) => Ok(error),
            (Some(call), reply) => answer_to(call, reply).ok_or_else(out_of_step_error),
            (None, reply) => Ok(reply),
        })
        .collect()
}

const OUT_OF_STEP: &str = "a reply on this connection answered another call (the connection is replaced)";

/// The error of a call that got another call's reply.
pub(super) fn out_of_step_error() -> RedisError {
    RedisError::from((redis::ErrorKind::Io, OUT_OF_STEP))
}

/// Whether `e` says a call got another call's reply.
pub(super) fn is_out_of_step(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Io && e.to_string().contains(OUT_OF_STEP)
}

/// Whether a whole-call error cannot be the answer to a call of ours, so it answers another command sent on
/// the connection: CROSSSLOT, as every call of ours declares keys of one slot (a spread call declares one key;
/// a multi-key call goes to a cluster only when its records share a slot). Seen in a live slot migration: the
/// redis crate re-subscribes a node to its shard channels in one SSUBSCRIBE per node, whose channels' slots
/// differ, and the server's CROSSSLOT for it came back as a release's reply.
fn answers_another_command(e: &redis::ServerError) -> bool {
    e.code() == "CROSSSLOT"
}

fn is_call(value: &Value, call: &str) -> bool {
    matches!(value, Value::BulkString(bytes) if bytes == call.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter().map(|a| if let Arg::Simple(a) = a { a.to_vec() } else { Vec::new() }).collect()
    }

    #[test]
    fn calls_of_our_scripts_are_numbered_and_other_commands_are_not() {
        let script = &*scripts::RELEASE;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(1).arg("key").arg("token");
        let (numbered_call, call) =
            numbered(&evalsha, Frame::Numbered).expect("a call of a script of ours is numbered");
        let sent = args(&numbered_call);
        assert_eq!(sent[1], script.numbered.sha.as_bytes(), "the same script in the call-number frame");
        assert_eq!(sent[2..5], args(&evalsha)[2..], "the same keys and arguments");
        assert_eq!(sent.last().map(Vec::as_slice), Some(call.as_bytes()), "the number is the last argument");
        let (_, next) = numbered(&evalsha, Frame::Numbered).expect("numbered");
        assert_ne!(call, next, "every call gets its own number");

        let mut eval = redis::cmd("eval");
        eval.arg(script.source).arg(1).arg("key").arg("token");
        let (numbered_eval, _) = numbered(&eval, Frame::Numbered).expect("EVAL in any case");
        assert_eq!(args(&numbered_eval)[1], script.numbered.source.as_bytes());

        assert!(numbered(&redis::cmd("WAIT"), Frame::Numbered).is_none());
        assert!(numbered(redis::cmd("EVAL").arg("return 1").arg(0), Frame::Numbered).is_none(), "not a script of ours");
    }

    /// On a cluster the numbered call runs the variant that announces with SPUBLISH, by SHA and by source.
    #[test]
    fn cluster_calls_run_the_sharded_variant() {
        let script = &*scripts::RELEASE;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&script.sha).arg(1).arg("key").arg("token");
        let (sharded, call) = numbered(&evalsha, Frame::Sharded).expect("numbered on a cluster");
        let sent = args(&sharded);
        assert_eq!(sent[1], script.sharded.sha.as_bytes());
        assert_eq!(sent[2..5], args(&evalsha)[2..], "the same keys and arguments");
        assert_eq!(sent.last().map(Vec::as_slice), Some(call.as_bytes()), "the number is the last argument");
        let mut eval = redis::cmd("EVAL");
        eval.arg(script.source).arg(1).arg("key").arg("token");
        let (sharded_eval, _) = numbered(&eval, Frame::Sharded).expect("EVAL on a cluster");
        assert_eq!(args(&sharded_eval)[1], script.sharded.source.as_bytes());
    }

    #[test]
    fn a_reply_is_used_only_by_the_call_it_answers() {
        let reply = |call: &str, own: Value| Value::Array(vec![Value::BulkString(call.into()), own]);
        assert_eq!(answer_to("7", reply("7", Value::Int(1))), Some(Value::Int(1)));
        assert_eq!(
            answer_to("7", Value::Array(vec![Value::BulkString(b"7".to_vec())])),
            Some(Value::Nil),
            "a nil reply"
        );
        assert_eq!(answer_to("7", reply("6", Value::Int(1))), None, "another call's reply");
        assert_eq!(answer_to("7", Value::Int(1)), None, "an unnumbered reply");
        let subscribed = Value::Push {
            kind: redis::PushKind::Subscribe,
            data: vec![Value::BulkString(b"distlock:{a}:released".to_vec()), Value::Int(1)],
        };
        assert_eq!(answer_to("7", subscribed), None, "a subscription's confirmation (seen during a slot migration)");
    }

    fn server_error(text: &str) -> redis::ServerError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => e,
            other => panic!("not a server error: {other:?}"),
        }
    }

    fn numbered_reply(call: &str, own: Value) -> Value {
        Value::Array(vec![Value::BulkString(call.into()), own])
    }

    const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";
    const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

    /// A numbered call keeps its own reply and its own errors; another call's reply, or a CROSSSLOT (which
    /// no call of ours can cause), is out of step.
    #[test]
    fn a_numbered_call_takes_only_its_own_reply() {
        assert_eq!(reply_to("7", numbered_reply("7", Value::Int(1))).expect("own"), Value::Int(1));
        let own_error = reply_to("7", numbered_reply("7", Value::ServerError(server_error("ERR oops"))));
        assert!(
            own_error.as_ref().is_err_and(|e| !is_out_of_step(e) && e.to_string().contains("oops")),
            "{own_error:?}"
        );
        // NOSCRIPT is the call's own whole-call error, handed on as a reply for `send_script` to send the source.
        match reply_to("7", Value::ServerError(server_error(NOSCRIPT))) {
            Ok(Value::ServerError(e)) => assert_eq!(e.code(), "NOSCRIPT"),
            other => panic!("NOSCRIPT not handed on: {other:?}"),
        }
        for (what, reply) in [
            ("another call's reply", numbered_reply("6", Value::Int(1))),
            ("an unnumbered reply", Value::Okay),
            ("a CROSSSLOT", Value::ServerError(server_error(CROSSSLOT))),
        ] {
            let answer = reply_to("7", reply);
            assert!(answer.as_ref().is_err_and(is_out_of_step), "{what}: {answer:?}");
        }
    }

    fn renew_many_call() -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&scripts::RENEW_MANY.sha).arg(1).arg("key").arg("token").arg(1000);
        cmd
    }

    /// A pipeline's calls of our scripts are numbered, in place; other commands pass as they were; a pipeline
    /// without a call of ours is not rebuilt.
    #[test]
    fn a_pipeline_numbers_the_calls_of_our_scripts() {
        let mut pipeline = redis::pipe();
        pipeline.add_command(renew_many_call()).add_command(redis::cmd("PING")).add_command(renew_many_call());
        let (numbered, calls) = numbered_pipeline(&pipeline, Frame::Numbered).expect("numbered");
        assert!(calls[0].is_some() && calls[1].is_none() && calls[2].is_some(), "{calls:?}");
        let sent: Vec<Vec<Vec<u8>>> = numbered.cmd_iter().map(args).collect();
        assert_eq!(sent[0][1], scripts::RENEW_MANY.numbered.sha.as_bytes());
        assert_eq!(sent[1], args(&redis::cmd("PING")));
        assert_eq!(sent[2].last().map(Vec::as_slice), calls[2].as_ref().map(|c| c.as_bytes()));
        let (sharded, _) = numbered_pipeline(&pipeline, Frame::Sharded).expect("numbered on a cluster");
        assert_eq!(sharded.cmd_iter().next().map(args).expect("first")[1], scripts::RENEW_MANY.sharded.sha.as_bytes());

        let mut others = redis::pipe();
        others.add_command(redis::cmd("PING")).add_command(redis::cmd("EVAL").arg("return 1").arg(0).clone());
        assert!(numbered_pipeline(&others, Frame::Numbered).is_none(), "nothing of ours to number");
    }

    /// A pipeline's replies from `offset` on answer its calls from there; one out of step fails them all. A
    /// CROSSSLOT is out of step for a numbered call, and a command's own error for another command.
    #[test]
    fn a_pipeline_takes_only_its_own_replies() {
        let calls = vec![None, Some("8".to_owned()), None, Some("9".to_owned())];
        let noscript = Value::ServerError(server_error(NOSCRIPT));
        let replies = vec![numbered_reply("8", Value::Int(1)), Value::Okay, noscript.clone()];
        assert_eq!(replies_to(&calls, 1, replies).expect("own"), vec![Value::Int(1), Value::Okay, noscript]);
        let crossslot = Value::ServerError(server_error(CROSSSLOT));
        assert_eq!(replies_to(&calls, 2, vec![crossslot.clone()]).expect("not ours"), vec![crossslot.clone()]);
        for (what, replies) in [
            ("another call's reply", vec![Value::Okay, numbered_reply("8", Value::Int(1))]),
            ("a CROSSSLOT to a numbered call", vec![Value::Okay, crossslot]),
            ("an unnumbered reply", vec![Value::Okay, Value::Int(1)]),
        ] {
            let answers = replies_to(&calls, 2, replies);
            assert!(answers.as_ref().is_err_and(is_out_of_step), "{what}: {answers:?}");
        }
    }

    #[test]
    fn a_cross_slot_error_answers_another_command() {
        let error = server_error;
        assert!(answers_another_command(&error("CROSSSLOT Keys in request don't hash to the same slot")));
        for own in [
            "NOSCRIPT No matching script. Please use EVAL.",
            "MOVED 3999 127.0.0.1:6381",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "ERR Error running script (call to f_0123): @user_script:1: oops",
        ] {
            assert!(!answers_another_command(&error(own)), "{own}");
        }
    }
}
