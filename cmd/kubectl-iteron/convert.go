package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"iteron.dev/operator/api/v1alpha1"
)

// activationManifest is the ImplementationActivation convert writes: only
// what the raw document carries, the rest left to the API server's defaults
// (no creationTimestamp: null, no empty status).
type activationManifest struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"metadata"`
	Spec v1alpha1.ImplementationActivationSpec `json:"spec"`
}

func newConvertCmd() *cobra.Command {
	var to, name, namespace, nodeName string
	cmd := &cobra.Command{
		Use:   "convert [--to yaml|json] [--name N --node-name NODE [--namespace NS]] <file|->",
		Short: "Convert between a raw activation document (JSON) and an ImplementationActivation (YAML)",
		Long: `Convert a raw activation document (docs/reference/activation.md, snake_case
JSON) into an ImplementationActivation in YAML — --name and --node-name are
required, since the raw document has neither — or an ImplementationActivation
(YAML or JSON) into the raw document. Both sides are parsed strictly. Spec fields the raw
document has no place for (nodeName, capabilityCeiling, swap, checkpoint, …)
are dropped, each named on stderr. --to defaults to the other form.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to != "" && to != "yaml" && to != "json" {
				return usage(fmt.Errorf("--to must be yaml or json, not %q", to))
			}
			in, err := loadActivation(cmd, args[0])
			if err != nil {
				return err
			}
			if to == "" {
				to = "yaml"
				if in.object != nil {
					to = "json"
				}
			}
			if to == "json" {
				if in.object != nil {
					for _, d := range droppedFields(in.object) {
						fmt.Fprintf(cmd.ErrOrStderr(), "note: %s has no place in the raw document: dropped\n", d)
					}
				}
				out, err := in.doc.MarshalDocument()
				if err != nil {
					return invalid(err)
				}
				_, err = cmd.OutOrStdout().Write(out)
				return err
			}

			var m activationManifest
			m.APIVersion, m.Kind = v1alpha1.GroupVersion.String(), "ImplementationActivation"
			if in.object != nil {
				// YAML to YAML: a normalising round trip of the object.
				m.Metadata.Name, m.Metadata.Namespace, m.Spec = in.object.Name, in.object.Namespace, in.object.Spec
				if name != "" {
					m.Metadata.Name = name
				}
				if namespace != "" {
					m.Metadata.Namespace = namespace
				}
				if nodeName != "" {
					m.Spec.NodeName = nodeName
				}
			} else {
				if name == "" || nodeName == "" {
					return usage(errors.New("converting a raw document to an ImplementationActivation needs --name and --node-name"))
				}
				m.Metadata.Name, m.Metadata.Namespace = name, namespace
				m.Spec = in.doc.Spec(nodeName)
			}
			out, err := yaml.Marshal(m)
			if err != nil {
				return invalid(err)
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "yaml (ImplementationActivation) or json (raw document); default: the other form")
	cmd.Flags().StringVar(&name, "name", "", "metadata.name of the ImplementationActivation (at most 40 characters)")
	cmd.Flags().StringVar(&namespace, "namespace", "", "metadata.namespace of the ImplementationActivation")
	cmd.Flags().StringVar(&nodeName, "node-name", "", "spec.nodeName: the node whose manager runs the providers")
	return cmd
}

// droppedFields names the set spec fields a raw document cannot carry.
func droppedFields(obj *v1alpha1.ImplementationActivation) []string {
	s := obj.Spec
	var out []string
	add := func(set bool, field string) {
		if set {
			out = append(out, field)
		}
	}
	add(obj.Name != "" || obj.Namespace != "" || len(obj.Labels) > 0 || len(obj.Annotations) > 0, "metadata")
	add(s.NodeName != "", "spec.nodeName")
	add(len(s.CapabilityCeiling) > 0, "spec.capabilityCeiling ("+joinCapabilities(s.CapabilityCeiling)+"): the raw document runs under the node's ceiling")
	add(s.Swap != (v1alpha1.SwapPolicy{}), "spec.swap")
	add(s.Checkpoint != (v1alpha1.CheckpointPolicy{}), "spec.checkpoint")
	add(s.GenerationHistoryLimit != nil, "spec.generationHistoryLimit")
	add(s.Paused, "spec.paused")
	return out
}

func joinCapabilities(caps []v1alpha1.Capability) string {
	s := make([]string, len(caps))
	for i, c := range caps {
		s[i] = string(c)
	}
	return strings.Join(s, ",")
}
