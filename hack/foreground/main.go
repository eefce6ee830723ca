// Command foreground runs a command as the terminal's foreground process group, so that a Ctrl-C
// reaches the command alone and not make(1) above it. make dies by the SIGINT it receives (exit
// status 130) however cleanly the command stops; `make dev` should end with the stack's own exit
// status, 0 after a normal Ctrl-C. When it is not started from the terminal's foreground group
// (no terminal, a background job, CI), it simply becomes the command.
//
//	foreground COMMAND [ARG...]
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: foreground COMMAND [ARG...]")
		os.Exit(2)
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "foreground:", err)
		os.Exit(127)
	}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil || !inForeground(tty) {
		if tty != nil {
			_ = tty.Close()
		}
		err := syscall.Exec(path, os.Args[1:], os.Environ())
		fmt.Fprintln(os.Stderr, "foreground:", err)
		os.Exit(126)
	}
	os.Exit(runInForeground(tty, path))
}

// inForeground: this process belongs to the terminal's foreground process group.
func inForeground(tty *os.File) bool {
	pgrp, err := unix.IoctlGetInt(int(tty.Fd()), unix.TIOCGPGRP)
	return err == nil && pgrp == unix.Getpgrp()
}

// runInForeground starts the command in a process group of its own that it makes the terminal's
// foreground group, waits for it, gives the terminal back to this process's group (make's) and
// returns the command's exit status.
func runInForeground(tty *os.File, path string) int {
	cmd := exec.Command(path, os.Args[2:]...)
	cmd.Args[0] = os.Args[1]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Foreground: true, Ctty: int(tty.Fd())}
	// The terminal's signals now go to the command's group. One sent to this process (make
	// stopped with SIGTERM, say) is passed on to that group.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "foreground:", err)
		return 126
	}
	go func() {
		for s := range sigs {
			_ = syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
		}
	}()
	err := cmd.Wait()
	// Taking the terminal back from a background group raises SIGTTOU, which would stop us.
	signal.Ignore(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(int(tty.Fd()), unix.TIOCSPGRP, unix.Getpgrp())
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return exit.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "foreground:", err)
		return 1
	}
}
