// Command confirm runs the confirm example agent (see examples/agents).
//
//	go run ./examples/confirm --broker mqtt://127.0.0.1:1883 --org demo --unit default --agent confirm
package main

import "github.com/a2a-fleet/a2a-fleet/examples/agents"

func main() { agents.Main(agents.KindConfirm) }
