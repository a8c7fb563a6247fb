//! Child processes driven line by line: the "service instances" of the
//! multi-process tests and the lottery demo. A child is killed when its
//! `Process` is dropped, and by the kernel (PR_SET_PDEATHSIG) when the thread
//! that started it dies, so a test killed without unwinding leaves no
//! instance behind: start children from a thread that outlives them.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

/// A child process whose stdout lines arrive on a channel. Killed on drop.
pub struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    name: String,
}

impl Process {
    /// Starts `program args...` with `REDIS_URL` set to `redis_url` (or
    /// removed when `None`), stdin and stdout piped, stderr inherited.
    pub fn spawn(program: impl AsRef<Path>, args: &[&str], redis_url: Option<&str>) -> Process {
        Self::spawn_with_env(program, args, redis_url, &[])
    }

    /// [`spawn`](Self::spawn) with more environment variables.
    pub fn spawn_with_env(
        program: impl AsRef<Path>,
        args: &[&str],
        redis_url: Option<&str>,
        env: &[(&str, &str)],
    ) -> Process {
        let program = program.as_ref();
        let mut command = Command::new(program);
        // SAFETY: prctl is async-signal-safe and touches only this child.
        // The child dies with the thread that started it, even if the test
        // process is killed without unwinding.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        match redis_url {
            Some(url) => command.env("REDIS_URL", url),
            None => command.env_remove("REDIS_URL"),
        };
        command.envs(env.iter().copied());
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", program.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Process {
            stdin: child.stdin.take(),
            child,
            lines,
            name: format!("{} {}", program.display(), args.join(" ")),
        }
    }

    /// The next stdout line, waiting at most `timeout`. Panics (naming the
    /// process) when none comes: the process hung or died.
    pub fn line(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => {
                panic!("`{}` printed nothing within {timeout:?}", self.name)
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                panic!("`{}` exited ({status:?}) before printing a line", self.name)
            }
        }
    }

    /// Writes one line to the process's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{line}").expect("write to child stdin");
        stdin.flush().expect("flush child stdin");
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes the process (SIGSTOP), as a long GC pause or an overloaded
    /// host would.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Freezes the process (SIGSTOP) and waits (at most `timeout`) until
    /// every one of its threads is stopped: `kill` only queues the signal,
    /// and a thread running on another core can go on for a moment (and
    /// send a request) after [`pause`](Self::pause) returned. Panics when
    /// the threads do not all stop in time.
    pub fn pause_fully(&self, timeout: Duration) {
        self.pause();
        let deadline = std::time::Instant::now() + timeout;
        while !self.is_stopped() {
            assert!(
                std::time::Instant::now() < deadline,
                "`{}`: not every thread stopped within {timeout:?} of SIGSTOP",
                self.name
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether every thread of the process is stopped (state `T` in
    /// `/proc/PID/task/*/stat`).
    pub fn is_stopped(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else {
            return false;
        };
        let mut any = false;
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue; // the thread exited meanwhile
            };
            // `PID (COMM) STATE ...`: COMM may hold spaces and parentheses.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            if state != Some("T") {
                return false;
            }
            any = true;
        }
        any
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the process without letting it run any code (SIGKILL), as a
    /// crash would, and reaps it.
    pub fn kill_hard(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits pid_t");
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        let result = unsafe { libc::kill(pid, signal) };
        assert_eq!(result, 0, "kill({pid}, {signal}) failed");
    }

    /// Waits for the process to exit (at most `timeout`) and panics unless it
    /// exited with status 0.
    pub fn wait_success(&mut self, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                assert!(status.success(), "`{}` failed: {status}", self.name);
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "`{}` did not exit within {timeout:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
