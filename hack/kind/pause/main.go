// Command pause is the sandbox ("infra") container of the kind node's pods: it holds the pod's
// namespaces and does nothing else until it is told to stop, like registry.k8s.io/pause, whose
// image cannot be pulled on a machine without a registry. As PID 1 of a pod that shares its process
// namespace it also reaps the orphans that are re-parented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
