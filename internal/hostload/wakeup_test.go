package hostload

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// processCPU is the process's user and system CPU.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkThreadWakeUp measures what a wake-up costs on this machine, the unit in which a
// process that sleeps between events (the broker's plugin between changes, docs/benchmarks.md)
// pays for each one: the CPU of a round trip between two OS threads (each side sleeps in a
// futex and is woken by the other) and of one nanosleep of 20 µs (what the Go runtime's sysmon
// sleeps while a P is held in a syscall or in C). On a paravirtualised guest a switch costs
// several times what it costs on bare metal.
//
//	go test ./internal/hostload -run '^$' -bench ThreadWakeUp -benchtime 20000x
func BenchmarkThreadWakeUp(b *testing.B) {
	b.Run("round-trip", func(b *testing.B) {
		ping, pong := make(chan struct{}), make(chan struct{})
		go func() {
			runtime.LockOSThread()
			for range ping {
				pong <- struct{}{}
			}
		}()
		defer close(ping)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cpu0 := processCPU(b)
		b.ResetTimer()
		for b.Loop() {
			ping <- struct{}{}
			<-pong
		}
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
		b.Logf("%s", Label())
	})
	b.Run("nanosleep-20µs", func(b *testing.B) {
		cpu0 := processCPU(b)
		b.ResetTimer()
		for b.Loop() {
			// EINTR: the Go runtime's preemption signal; the sleep was still a wake-up.
			if err := syscall.Nanosleep(&syscall.Timespec{Nsec: 20_000}, nil); err != nil && err != syscall.EINTR {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
		b.Logf("%s", Label())
	})
}
