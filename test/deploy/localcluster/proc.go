package localcluster

import (
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"
)

// Proc is one process (a container, or a client the tests run beside the cluster). Its output goes to a log file (appended across restarts).
type Proc struct {
	cmd     *exec.Cmd
	log     string
	offset  int64
	exited  chan struct{}
	stopped atomic.Bool
}

// StartProcess runs argv with exactly env (nothing inherited), as cred when not nil, writing its
// output to logPath.
func StartProcess(logPath string, argv, env []string, cred *syscall.Credential) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	st, _ := f.Stat()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group: a test's Ctrl-C does not race the cleanup; a kill reaches its children.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("exec %v: %w", argv, err)
	}
	p := &Proc{cmd: cmd, log: logPath, offset: st.Size(), exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// ExitCode is the exit status (-1 while running or when killed by a signal).
func (p *Proc) ExitCode() int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Kill is kill -9 of the process group; it returns once the process has exited.
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// Signal sends sig and waits up to grace for the exit, then kills; it reports whether the
// process had to be killed.
func (p *Proc) Signal(sig syscall.Signal, grace time.Duration) (killed bool) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	select {
	case <-p.exited:
		return false
	case <-time.After(grace):
		p.Kill()
		return true
	}
}

// Output is what this run of the process wrote so far.
func (p *Proc) Output() string {
	data, err := os.ReadFile(p.log)
	if err != nil || int64(len(data)) < p.offset {
		return ""
	}
	return string(data[p.offset:])
}
