package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// shutdownBound is how long a stop may take from the first Ctrl-C or SIGTERM. Every part of the
// stack stops within its own bound well inside it (the broker in about 4 s, the manager 5 s,
// each control-plane process 5 s); if the whole does not, the stack stops the control plane
// itself and exits 1, so no etcd or kube-apiserver is ever left behind. A second signal does
// the same at once.
const shutdownBound = 9 * time.Second

// lastResort holds what must be stopped even when the graceful stop hangs: the control plane
// processes, which run in their own process groups and would outlive this one.
var lastResort struct {
	sync.Mutex
	stops []func()
}

// onForcedExit registers stop to run before a forced exit (it must be safe to call twice).
func onForcedExit(stop func()) {
	lastResort.Lock()
	defer lastResort.Unlock()
	lastResort.stops = append(lastResort.stops, stop)
}

// signalContext is cancelled by the first SIGINT or SIGTERM; a second signal, or a graceful stop
// still running shutdownBound after the first, stops the control plane and exits 1.
func signalContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "devstack: %s: stopping (at most %s; a second Ctrl-C stops at once)\n", sig, shutdownBound)
		cancel()
		select {
		case sig = <-sigs:
			fmt.Fprintf(os.Stderr, "devstack: %s again: stopping the control plane and exiting\n", sig)
		case <-time.After(shutdownBound):
			fmt.Fprintf(os.Stderr, "devstack: the stop did not finish within %s: stopping the control plane and exiting\n", shutdownBound)
		}
		forcedExit()
	}()
	return ctx
}

func forcedExit() {
	lastResort.Lock()
	stops := lastResort.stops
	lastResort.Unlock()
	var wg sync.WaitGroup
	for _, stop := range stops {
		wg.Go(stop)
	}
	wg.Wait()
	os.Exit(1)
}

// staleProcess is a control-plane process of an earlier devstack on the same state dir.
type staleProcess struct {
	pid, ppid int
	name      string
}

// stopStaleControlPlane finds an etcd on etcdDir and the kube-apiservers and
// kube-controller-managers that use it, left running by an earlier devstack that crashed or was
// killed (they run in their own process groups), and stops them, saying so. An etcd whose parent
// is a running devstack belongs to a stack that is still up: that is an error, not something to
// clean up.
func stopStaleControlPlane(etcdDir, stateDir string) error {
	stale := controlPlaneProcesses(etcdDir, stateDir)
	for _, p := range stale {
		if p.name == "etcd" && isDevstack(p.ppid) {
			return fmt.Errorf("an etcd (pid %d) of another devstack (pid %d) is running on %s: stop that one first, or use another --state-dir", p.pid, p.ppid, etcdDir)
		}
	}
	for _, p := range stale {
		fmt.Fprintf(os.Stderr, "devstack: a %s (pid %d) of an earlier devstack on %s is still running (that devstack crashed or was killed): stopping it\n", p.name, p.pid, stateDir)
		if err := terminate(p.pid, 10*time.Second); err != nil {
			return fmt.Errorf("stop the %s (pid %d) left by an earlier devstack: %w", p.name, p.pid, err)
		}
	}
	return nil
}

// controlPlaneProcesses lists the running etcd on etcdDir and the kube-apiservers (by their
// --etcd-servers) and kube-controller-managers (by a --kubeconfig in stateDir) that use it, the
// etcd last.
func controlPlaneProcesses(etcdDir, stateDir string) []staleProcess {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil // not Linux: nothing to look at
	}
	type proc struct {
		pid, ppid int
		args      []string
	}
	var all []proc
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || zombie(pid) {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue
		}
		all = append(all, proc{pid: pid, ppid: parentOf(pid), args: strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")})
	}
	flag := func(p proc, name string) string {
		for _, a := range p.args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	var etcds, users []staleProcess
	var etcdURLs []string
	for _, p := range all {
		if filepath.Base(p.args[0]) == "etcd" && filepath.Clean(flag(p, "data-dir")) == filepath.Clean(etcdDir) {
			etcds = append(etcds, staleProcess{p.pid, p.ppid, "etcd"})
			etcdURLs = append(etcdURLs, strings.Split(flag(p, "listen-client-urls"), ",")...)
		}
	}
	for _, p := range all {
		switch filepath.Base(p.args[0]) {
		case "kube-apiserver":
			if u := flag(p, "etcd-servers"); u != "" && slices.Contains(etcdURLs, u) {
				users = append(users, staleProcess{p.pid, p.ppid, "kube-apiserver"})
			}
		case "kube-controller-manager":
			if strings.HasPrefix(flag(p, "kubeconfig"), filepath.Clean(stateDir)+string(filepath.Separator)) {
				users = append(users, staleProcess{p.pid, p.ppid, "kube-controller-manager"})
			}
		}
	}
	return append(users, etcds...)
}

// parentOf reads a process's parent pid (0 when unknown).
func parentOf(pid int) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses, so cut at the last ')'.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// isDevstack reports whether pid is a running devstack (an orphaned etcd has been adopted by
// init or a subreaper instead).
func isDevstack(pid int) bool {
	if pid <= 1 {
		return false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return filepath.Base(strings.SplitN(string(raw), "\x00", 2)[0]) == "devstack"
}

// terminate sends SIGTERM, waits up to grace for the process to go, then SIGKILL.
func terminate(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !alive(pid) || zombie(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

func zombie(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(raw, ')')
	return i >= 0 && len(raw) > i+2 && raw[i+2] == 'Z'
}
