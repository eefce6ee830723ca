// Command runc-capfilter is an OCI runtime that removes from a container's capability sets every
// capability the host's bounding set lacks, then executes runc with the same arguments.
//
// Why: Docker 20.10 (Debian bookworm's docker.io) gives a --privileged container every capability
// it knows, not the ones the daemon holds (moby#42906, fixed upstream by moby#42933 but not in
// Debian's 20.10). On a VM whose bounding set lacks one of them (here CAP_SYS_RESOURCE), runc then
// fails "unable to apply caps: operation not permitted", so no kind node can start. hack/kind/
// dockerd.sh registers this program as dockerd's default runtime; for unprivileged containers it
// changes nothing, because their capabilities are all in the bounding set anyway.
//
// It rewrites the bundle's config.json for `create` and `run`, and the --process file for `exec`.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// capabilityBits numbers the capabilities as linux/capability.h does.
var capabilityBits = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

const runcPath = "/usr/sbin/runc"

func main() {
	if err := filterFor(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "runc-capfilter: %v\n", err)
		os.Exit(1)
	}
	runc := os.Getenv("RUNC_CAPFILTER_RUNC")
	if runc == "" {
		runc = runcPath
	}
	err := syscall.Exec(runc, append([]string{runc}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "runc-capfilter: exec %s: %v\n", runc, err)
	os.Exit(1)
}

// filterFor finds the spec file the runc command line names and filters its capabilities.
func filterFor(args []string) error {
	command, flags := splitCommand(args)
	switch command {
	case "create", "run":
		bundle := flagValue(flags, "--bundle", "-b")
		if bundle == "" {
			bundle = "."
		}
		return filterFile(filepath.Join(bundle, "config.json"), true)
	case "exec":
		if process := flagValue(flags, "--process", "-p"); process != "" {
			return filterFile(process, false)
		}
	}
	return nil
}

// globalFlagsWithValue are runc's global flags that take a separate value.
var globalFlagsWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

// splitCommand returns the runc subcommand and the arguments after it.
func splitCommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a, args[i+1:]
		}
		if globalFlagsWithValue[a] && !strings.Contains(a, "=") {
			i++
		}
	}
	return "", nil
}

func flagValue(args []string, names ...string) string {
	for i, a := range args {
		for _, n := range names {
			if a == n && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, n+"="); ok {
				return v
			}
		}
	}
	return ""
}

// filterFile rewrites the capabilities of a runtime spec (config.json, whose process is under
// "process") or of a process spec (exec --process), keeping every other field as it was.
func filterFile(path string, fullSpec bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	allowed, err := boundingSet()
	if err != nil {
		return err
	}
	process := doc
	if fullSpec {
		if doc["process"] == nil {
			return nil
		}
		if err := json.Unmarshal(doc["process"], &process); err != nil {
			return fmt.Errorf("parse %s process: %w", path, err)
		}
	}
	if process["capabilities"] == nil {
		return nil
	}
	var sets map[string][]string
	if err := json.Unmarshal(process["capabilities"], &sets); err != nil {
		return fmt.Errorf("parse %s capabilities: %w", path, err)
	}
	changed := false
	for name, caps := range sets {
		kept := caps[:0:0]
		for _, c := range caps {
			if allowed[c] {
				kept = append(kept, c)
			}
		}
		if len(kept) != len(caps) {
			sets[name], changed = kept, true
		}
	}
	if !changed {
		return nil
	}
	if process["capabilities"], err = json.Marshal(sets); err != nil {
		return err
	}
	if fullSpec {
		if doc["process"], err = json.Marshal(process); err != nil {
			return err
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// boundingSet reads this process's capability bounding set (CapBnd in /proc/self/status): the
// capabilities any process it starts can ever hold.
func boundingSet() (map[string]bool, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		hex, ok := strings.CutPrefix(scanner.Text(), "CapBnd:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("parse CapBnd %q: %w", hex, err)
		}
		allowed := map[string]bool{}
		for bit, name := range capabilityBits {
			if mask&(1<<bit) != 0 {
				allowed[name] = true
			}
		}
		return allowed, nil
	}
	return nil, fmt.Errorf("no CapBnd line in /proc/self/status")
}
