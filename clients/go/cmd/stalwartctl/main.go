// Command stalwartctl is a small example of driving Stalwart from Go:
//
//	stalwartctl nodes                       list registered nodes
//	stalwartctl jobs                        list jobs
//	stalwartctl submit -model mlp -slots 2  admit a job
//
// Coordinators come from -coordinator or $STALWART_COORDINATOR (comma-separated
// host:port); the token from $STALWART_ADMIN_TOKEN. Output is a table, or JSON
// with -o json (protobuf's JSON mapping, so it matches other languages').
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/stalwart-ml/stalwart/clients/go/stalwart"
	pb "github.com/stalwart-ml/stalwart/clients/go/stalwartv1"
)

// Exit codes as the Python CLI names them.
const (
	exitError        = 1
	exitInvalidInput = 2
	exitNoConnection = 3
)

func main() {
	global := flag.NewFlagSet("stalwartctl", flag.ExitOnError)
	addrs := global.String("coordinator", os.Getenv("STALWART_COORDINATOR"), "coordinator host:port list")
	output := global.String("o", "table", "output: table or json")
	timeout := global.Duration("timeout", 10*time.Second, "deadline of each call")
	global.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: stalwartctl [-coordinator host:port,...] [-o table|json] nodes|jobs|submit [flags]")
		global.PrintDefaults()
	}
	_ = global.Parse(os.Args[1:])
	if global.NArg() < 1 || *addrs == "" {
		global.Usage()
		os.Exit(exitInvalidInput)
	}
	c := stalwart.NewCoordinator([]string{*addrs}, stalwart.Options{Token: os.Getenv("STALWART_ADMIN_TOKEN")})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var err error
	switch cmd, args := global.Arg(0), global.Args()[1:]; cmd {
	case "nodes":
		err = nodes(ctx, c, *output)
	case "jobs":
		err = jobs(ctx, c, *output)
	case "submit":
		err = submit(ctx, c, *output, args)
	default:
		fmt.Fprintf(os.Stderr, "Error: unknown command %q\n", cmd)
		os.Exit(exitInvalidInput)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		if reason, _ := stalwart.Reason(err); reason == "" && strings.Contains(err.Error(), "Unavailable") {
			os.Exit(exitNoConnection)
		}
		os.Exit(exitError)
	}
}

func printJSON[T proto.Message](items []T) error {
	raw := make([]json.RawMessage, len(items))
	for i, m := range items {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		raw[i] = b
	}
	out, err := json.MarshalIndent(raw, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

func nodes(ctx context.Context, c *stalwart.Coordinator, output string) error {
	list, err := c.ListNodes(ctx)
	if err != nil || output == "json" {
		if err != nil {
			return err
		}
		return printJSON(list)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tROLE\tSTATE\tADDRESS\tJOB\tSLOT\tHEALTH")
	for _, n := range list {
		role := strings.TrimPrefix(n.GetRole().String(), "NODE_ROLE_")
		state := strings.TrimPrefix(n.GetState().String(), "NODE_STATE_")
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%.2f\n", n.GetNodeId(), role, state,
			n.GetAddress(), n.GetJobId(), n.GetSlot(), n.GetHealthScore())
	}
	return w.Flush()
}

func jobs(ctx context.Context, c *stalwart.Coordinator, output string) error {
	list, err := c.ListJobs(ctx)
	if err != nil || output == "json" {
		if err != nil {
			return err
		}
		return printJSON(list)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "JOB\tSTATE\tMODEL\tSLOTS\tSTEP\tREASON")
	for _, j := range list {
		state := strings.TrimPrefix(j.GetState().String(), "JOB_STATE_")
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d/%d\t%s\n", j.GetJobId(), state, j.GetSpec().GetModel(),
			j.GetSpec().GetNumSlots(), j.GetStep(), j.GetSpec().GetSteps(), j.GetReason())
	}
	return w.Flush()
}

func submit(ctx context.Context, c *stalwart.Coordinator, output string, args []string) error {
	spec := stalwart.DefaultSpec()
	fs := flag.NewFlagSet("submit", flag.ExitOnError)
	jobID := fs.String("job", "", "job id (generated when empty)")
	model := fs.String("model", spec.Model, "built-in model or package.module:function")
	slots := fs.Int("slots", int(spec.NumSlots), "data-parallel slots")
	steps := fs.Int64("steps", spec.Steps, "steps to run")
	lr := fs.Float64("lr", spec.Optimizer.Lr, "SGD learning rate")
	requestID := fs.String("request-id", fmt.Sprintf("stalwartctl-%d", time.Now().UnixNano()), "idempotency key")
	_ = fs.Parse(args)
	spec.Model, spec.NumSlots, spec.Steps, spec.Optimizer.Lr = *model, int32(*slots), *steps, *lr
	job, err := c.SubmitJob(ctx, *jobID, *requestID, spec)
	if err != nil {
		return err
	}
	if output == "json" {
		return printJSON([]*pb.Job{job})
	}
	fmt.Printf("submitted %s (%s)\n", job.GetJobId(), strings.TrimPrefix(job.GetState().String(), "JOB_STATE_"))
	return nil
}
