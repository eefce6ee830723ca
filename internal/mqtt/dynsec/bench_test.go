package dynsec

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/hostload"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
)

// BenchmarkMessageCostByClients measures what one control message of 500 commands costs
// Mosquitto 2.0.11 as its dynsec configuration grows: the plugin rewrites its whole JSON file
// after every modifying command, so the cost of a command grows with the number of clients
// already configured. For each size (DYNSEC_CLIENTS, default 0,500,1000,2500,5000) a fresh
// broker is filled with that many clients (one role and one client each, in 100-command
// messages, timed too), then one message of 500 createRole commands is timed.
//
//	go test ./internal/mqtt/dynsec -run '^$' -bench MessageCostByClients -benchtime 1x -timeout 60m
func BenchmarkMessageCostByClients(b *testing.B) {
	sizes := os.Getenv("DYNSEC_CLIENTS")
	if sizes == "" {
		sizes = "0,500,1000,2500,5000"
	}
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("DYNSEC_CLIENTS: %v", err)
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for range b.N {
				m := brokertest.StartMosquitto(b, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}})
				user, pass := m.DynSecAdmin()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
				be, err := Connect(ctx, Config{URL: m.URL(), Username: user, Password: pass, Timeout: 30 * time.Minute, Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					b.Fatal(err)
				}
				fillStart := time.Now()
				var cmds []acl.Command
				for i := range n {
					role := fmt.Sprintf("a2a:fill-%05d", i)
					cmds = append(cmds,
						acl.Command{Op: acl.OpCreateRole, Role: role, ACLs: []acl.ACL{{Type: acl.PublishClientSend, Topic: "$a2a/v1/request/o/u/" + role, Allow: true}}},
						acl.Command{Op: acl.OpCreateClient, Username: "a2a:o/u/" + role, Password: "pw"},
						acl.Command{Op: acl.OpModifyClient, Username: "a2a:o/u/" + role, Roles: []acl.RoleRef{{Name: role}}})
				}
				if err := be.Execute(ctx, cmds); err != nil {
					b.Fatal(err)
				}
				fill := time.Since(fillStart)
				var probe []acl.Command
				for i := range 500 {
					probe = append(probe, acl.Command{Op: acl.OpCreateRole, Role: fmt.Sprintf("a2a:probe-%03d", i)})
				}
				// One message: raise the batch limits for the probe.
				be.cfg.MaxBatch, be.cfg.MaxBatchBytes = 1000, 1<<20
				before := readProcAccount(b, m.PID())
				start := time.Now()
				if err := be.Execute(ctx, probe); err != nil {
					b.Fatal(err)
				}
				msg := time.Since(start)
				after := readProcAccount(b, m.PID())
				size := int64(0)
				if fi, err := os.Stat(filepath.Join(filepath.Dir(m.ConfigPath()), "dynamic-security.json")); err == nil {
					size = fi.Size()
				}
				// The save, measured from the broker's side: what Mosquitto wrote and the CPU
				// it used per command of the probe (/proc/<pid>/io, /proc/<pid>/stat).
				written := float64(after.wchar-before.wchar) / 500
				writes := float64(after.syscw-before.syscw) / 500
				cpu := (after.cpu - before.cpu) / 500
				b.ReportMetric(written/1024, "KiB-written/cmd")
				b.ReportMetric(writes, "write-calls/cmd")
				b.ReportMetric(float64(cpu.Microseconds())/1000, "broker-cpu-ms/cmd")
				b.Logf("%d clients: per command Mosquitto wrote %.0f KiB in %.0f write calls (the file is %d KiB: %.2f× its size) and used %.2f ms of CPU of the %.2f ms the command took",
					n, written/1024, writes, size/1024, written/float64(max(size, 1)), float64(cpu.Microseconds())/1000, msg.Seconds()*1000/500)
				b.ReportMetric(msg.Seconds(), "s/500-cmd-message")
				b.ReportMetric(msg.Seconds()*1000/500, "ms/cmd")
				b.ReportMetric(fill.Seconds(), "s-to-fill")
				b.ReportMetric(float64(size)/1024, "config-KiB")
				b.Logf("%d clients: one 500-command message %.2f s (%.1f ms/command); filling took %.1f s (%d commands); config %d KiB; %s",
					n, msg.Seconds(), msg.Seconds()*1000/500, fill.Seconds(), len(cmds), size/1024, hostload.Label())
				_ = be.Close(context.Background())
				cancel()
				m.Kill()
			}
		})
	}
}

// procAccount is a process's write accounting and CPU time.
type procAccount struct {
	wchar, syscw int64 // bytes passed to write(2) and friends, and how many calls
	cpu          time.Duration
}

func readProcAccount(b *testing.B, pid int) procAccount {
	b.Helper()
	var a procAccount
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		b.Fatalf("broker's I/O accounting: %v", err)
	}
	for _, line := range strings.Split(string(io), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "wchar":
			a.wchar = n
		case "syscw":
			a.syscw = n
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatalf("broker's CPU accounting: %v", err)
	}
	// Fields after the command name (which may hold spaces): utime and stime are the 12th and
	// 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("broker's /proc stat: %q", stat)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	a.cpu = time.Duration(ut+st) * 10 * time.Millisecond
	return a
}
