package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// daemon is a server process the harness started (PostgreSQL, Redis). It
// runs in its own process group with a parent-death signal, so that it dies
// with fleetbench even when fleetbench is killed; stop ends the group.
type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// started lists the process ids of every daemon started, for tests that
// check none is left.
var (
	startedMu sync.Mutex
	started   []int
)

// startDaemon starts argv as user (empty: the current user) with its output
// in logPath.
func startDaemon(name, logPath string, cred *syscall.Credential, argv ...string) (*daemon, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("starting %s: %w", name, err), log.Close())
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan error, 1), log: log}
	startedMu.Lock()
	started = append(started, cmd.Process.Pid)
	startedMu.Unlock()
	go func() { d.done <- cmd.Wait() }()
	return d, nil
}

// pid returns the daemon's process id.
func (d *daemon) pid() int { return d.cmd.Process.Pid }

// stop asks the process group to terminate, then kills it after a grace
// period, and waits for the process.
func (d *daemon) stop() {
	pgid := d.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-d.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // anything left in the group
	_ = d.log.Close()
}

// logTail returns the end of the daemon's log, for error messages.
func (d *daemon) logTail() string {
	b, err := os.ReadFile(d.log.Name())
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = s[len(s)-2000:]
	}
	return s
}

// waitPort waits until addr accepts TCP connections or the daemon exits.
func (d *daemon) waitPort(ctx context.Context, addr string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("%s exited before listening (%w): %s", d.name, err, d.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within a minute: %s", d.name, addr, d.logTail())
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runAs runs argv to completion as cred (nil: the current user).
func runAs(cred *syscall.Credential, argv ...string) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unprivileged returns the credential of the named system user when
// fleetbench runs as root (PostgreSQL refuses to run as root), else nil.
func unprivileged(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("running as root needs the %q user to start the server as: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// procRSS returns the resident set size and its peak (VmRSS, VmHWM) of a
// process in bytes.
func procRSS(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak, nil
}

// baselineRSS starts a peak measurement: it collects the garbage and
// returns the freed pages to the OS (debug.FreeOSMemory), resets the
// process's peak RSS (VmHWM) to its current RSS (Linux's
// /proc/self/clear_refs, "5"), and returns that RSS (VmRSS). A peak read
// later (procRSS) less it is what the process grew by since. Without
// returning the freed pages first, garbage of what ran before (generating
// a fleet, an earlier run) would sit in the baseline as retained heap, and
// the measured load would reuse those pages instead of growing the
// process: its growth would read smaller than it is.
func baselineRSS() (int64, error) {
	runtime.GC()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0, fmt.Errorf("resetting the peak RSS: %w", err)
	}
	rss, _, err := procRSS(os.Getpid())
	return rss, err
}
