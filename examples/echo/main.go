// Command echo runs the echo example agent (see examples/agents).
//
//	go run ./examples/echo --broker mqtt://127.0.0.1:1883 --org demo --unit default --agent echo
package main

import "github.com/a2a-fleet/a2a-fleet/examples/agents"

func main() { agents.Main(agents.KindEcho) }
