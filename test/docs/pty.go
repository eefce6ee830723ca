// Package docs runs the shell examples of README.md and docs/sdk.md against `make dev`, as a
// newcomer would type them (issue 26), and checks that `make dev` ends with exit status 0 after
// a Ctrl-C.
package docs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// terminal is a pseudo-terminal with one process on it, as a shell in a terminal window would
// run it: the process leads its own session with the terminal as controlling terminal, so a
// Ctrl-C typed into it is delivered by the kernel to its foreground process group.
type terminal struct {
	master *os.File
	cmd    *exec.Cmd

	mu  sync.Mutex
	out bytes.Buffer

	done chan struct{}
	err  error
	// drained is closed when the reader has read everything the terminal showed (the pty
	// reports EIO once the last process holding it has gone and its buffer is empty).
	drained chan struct{}
}

func startTerminal(cmd *exec.Cmd) (*terminal, error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, fmt.Errorf("unlock pty: %w", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, fmt.Errorf("pty number: %w", err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, fmt.Errorf("open pty slave: %w", err)
	}
	defer slave.Close()
	// A wide terminal, so nothing wraps.
	_ = unix.IoctlSetWinsize(int(slave.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: 250})
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		master.Close()
		return nil, err
	}
	t := &terminal{master: master, cmd: cmd, done: make(chan struct{}), drained: make(chan struct{})}
	go func() {
		defer close(t.drained)
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			t.mu.Lock()
			t.out.Write(buf[:n])
			t.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	go func() {
		t.err = cmd.Wait()
		close(t.done)
	}()
	return t, nil
}

// output is everything the terminal showed so far, with the terminal's CRLF as LF.
func (t *terminal) output() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ReplaceAll(t.out.String(), "\r\n", "\n")
}

// waitFor waits until the output contains s (after offset from), and returns the index after it.
func (t *terminal) waitFor(s string, from int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		out := t.output()
		if from <= len(out) {
			if i := strings.Index(out[from:], s); i >= 0 {
				return from + i + len(s), nil
			}
		}
		select {
		case <-t.done:
			out := t.output()
			if i := strings.Index(out[min(from, len(out)):], s); i >= 0 {
				return from + i + len(s), nil
			}
			return 0, fmt.Errorf("process ended (%v) before %q appeared; output:\n%s", t.err, s, out)
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%q did not appear within %s; output:\n%s", s, timeout, t.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// typeLine types a line as a user would (the terminal echoes it).
func (t *terminal) typeLine(s string) error {
	_, err := t.master.Write([]byte(s + "\r"))
	return err
}

// interrupt types Ctrl-C.
func (t *terminal) interrupt() error {
	_, err := t.master.Write([]byte{0x03})
	return err
}

// wait waits for the process to end and returns its exit status.
func (t *terminal) wait(timeout time.Duration) (int, error) {
	select {
	case <-t.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.done
		return -1, fmt.Errorf("still running after %s; output:\n%s", timeout, t.output())
	}
	// What the process (and the terminal's echo of what was typed) wrote last may still be in
	// the pty's buffer: read it before anyone looks at the output. Bounded, in case a process
	// the command left behind still holds the terminal.
	select {
	case <-t.drained:
	case <-time.After(5 * time.Second):
	}
	return t.cmd.ProcessState.ExitCode(), nil
}

func (t *terminal) close() {
	select {
	case <-t.done:
	default:
		_ = syscall.Kill(-t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.done
	}
	_ = t.master.Close()
}
