// gitops-judge asks the libraries GitOps tools use what they make of an object, so tests can assert it:
//
//	gitops-judge kstatus                      < object.json  kstatus (sigs.k8s.io/cli-utils and Flux's fork)
//	gitops-judge flux-cel KUSTOMIZATION.yaml  < object.json  Flux's healthCheckExprs evaluator, with the
//	                                                         expressions of the Kustomization in the file
//	gitops-judge lua-health SCRIPT            < object.json  an Argo CD health.lua
//	gitops-judge lua-discovery SCRIPT         < object.json  an Argo CD actions/discovery.lua
//	gitops-judge lua-action SCRIPT            < object.json  an Argo CD action.lua: prints the object it
//	                                                         returns and the merge patch Argo CD sends
//
// Each prints one JSON object. The Lua runs the way Argo CD runs a script from argocd-cm: gopher-lua with
// only the package, base, table and a safe os library open, the object as the global `obj`, one second of
// time, and the returned table read back through gopher-json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	jsonpatch "github.com/evanphx/json-patch"
	fluxstatus "github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/pkg/apis/kustomize"
	"github.com/fluxcd/pkg/runtime/cel"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gitops-judge:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: gitops-judge kstatus|flux-cel FILE|lua-health FILE|lua-discovery FILE|lua-action FILE")
	}
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	// As the API machinery decodes it: integers stay int64, which kstatus insists on.
	if err := obj.UnmarshalJSON(raw); err != nil {
		return fmt.Errorf("the object on stdin: %w", err)
	}
	var out any
	switch {
	case args[0] == "kstatus":
		out, err = kstatus(obj)
	case args[0] == "flux-cel" && len(args) == 2:
		out, err = fluxCEL(obj, args[1])
	case args[0] == "lua-health" && len(args) == 2:
		out, err = luaTable(obj, args[1])
	case args[0] == "lua-discovery" && len(args) == 2:
		out, err = luaTable(obj, args[1])
	case args[0] == "lua-action" && len(args) == 2:
		out, err = luaAction(obj, args[1])
	default:
		return fmt.Errorf("unknown command %v", args)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func kstatus(obj *unstructured.Unstructured) (any, error) {
	upstream, err := status.Compute(obj)
	if err != nil {
		return nil, fmt.Errorf("cli-utils: %w", err)
	}
	flux, err := fluxstatus.Compute(obj)
	if err != nil {
		return nil, fmt.Errorf("fluxcd/cli-utils: %w", err)
	}
	return map[string]verdict{
		"cliUtils": {string(upstream.Status), upstream.Message},
		"flux":     {string(flux.Status), flux.Message},
	}, nil
}

// fluxCEL evaluates obj with the healthCheckExprs a Kustomization file gives for its kind.
func fluxCEL(obj *unstructured.Unstructured, file string) (any, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var k struct {
		Spec struct {
			HealthCheckExprs []kustomize.CustomHealthCheck `json:"healthCheckExprs"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	for _, check := range k.Spec.HealthCheckExprs {
		if check.APIVersion != obj.GetAPIVersion() || check.Kind != obj.GetKind() {
			continue
		}
		evaluator, err := cel.NewStatusEvaluator(&check.HealthCheckExpressions)
		if err != nil {
			return nil, err
		}
		result, err := evaluator.Evaluate(context.Background(), obj)
		if err != nil {
			return nil, err
		}
		return verdict{string(result.Status), result.Message}, nil
	}
	return nil, fmt.Errorf("%s has no healthCheckExprs for %s %s", file, obj.GetAPIVersion(), obj.GetKind())
}

// runLua runs a script on obj as Argo CD does for a script from argocd-cm (useOpenLibs off), and returns
// the table it returns as JSON, encoded by gopher-json as Argo CD encodes it.
func runLua(obj *unstructured.Unstructured, file string) ([]byte, error) {
	script, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for name, open := range map[string]lua.LGFunction{
		lua.LoadLibName: lua.OpenPackage,
		lua.BaseLibName: lua.OpenBase,
		lua.TabLibName:  lua.OpenTable,
		lua.OsLibName:   openSafeOs,
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(open), NRet: 0, Protect: true}, lua.LString(name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj.Object))
	if err := l.DoString(string(script)); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	ret := l.Get(-1)
	if ret.Type() != lua.LTTable {
		return nil, fmt.Errorf("%s returned %s, not a table", file, ret.Type())
	}
	return luajson.Encode(ret)
}

// openSafeOs is the part of the os library Argo CD lets scripts use: time and date only.
func openSafeOs(l *lua.LState) int {
	mod := l.RegisterModule(lua.OsLibName, map[string]lua.LGFunction{
		"time": func(l *lua.LState) int { l.Push(lua.LNumber(time.Now().Unix())); return 1 },
		"date": func(l *lua.LState) int { l.Push(lua.LString(time.Now().Format(time.RFC3339))); return 1 },
	})
	l.Push(mod)
	return 1
}

// toLua converts decoded JSON to Lua values the way Argo CD's decodeValue does.
func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), toLua(l, item))
		}
		return t
	}
	return lua.LNil
}

func luaTable(obj *unstructured.Unstructured, file string) (any, error) {
	raw, err := runLua(obj, file)
	if err != nil {
		return nil, err
	}
	var out any
	return out, json.Unmarshal(raw, &out)
}

// luaAction returns what the action returned (an old-style action returns the whole object) and the merge
// patch Argo CD computes from the live object to it. A patch of status is an error: our actions change only
// the spec, which is what users and GitOps own.
func luaAction(obj *unstructured.Unstructured, file string) (any, error) {
	newRaw, err := runLua(obj, file)
	if err != nil {
		return nil, err
	}
	var changed map[string]any
	if err := json.Unmarshal(newRaw, &changed); err != nil {
		return nil, fmt.Errorf("%s did not return an object: %w", file, err)
	}
	changed = keepEmptyMaps(changed, obj.Object)
	newRaw, err = json.Marshal(changed)
	if err != nil {
		return nil, err
	}
	liveRaw, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, err
	}
	patchRaw, err := jsonpatch.CreateMergePatch(liveRaw, newRaw)
	if err != nil {
		return nil, err
	}
	var patch map[string]any
	if err := json.Unmarshal(patchRaw, &patch); err != nil {
		return nil, err
	}
	if _, ok := patch["status"]; ok {
		return nil, fmt.Errorf("%s changed status: %s", file, patchRaw)
	}
	return map[string]any{"object": changed, "patch": patch}, nil
}

// keepEmptyMaps undoes gopher-json's encoding of an empty table as [] where the live object had a map, as
// Argo CD does (cleanReturnedObj) before it computes the patch.
func keepEmptyMaps(changed, live map[string]any) map[string]any {
	for key, old := range live {
		switch v := changed[key].(type) {
		case map[string]any:
			if o, ok := old.(map[string]any); ok {
				changed[key] = keepEmptyMaps(v, o)
			}
		case []any:
			if o, ok := old.(map[string]any); ok && len(v) == 0 {
				changed[key] = o
			}
			if o, ok := old.([]any); ok {
				for i := range v {
					if i < len(o) {
						if vm, ok := v[i].(map[string]any); ok {
							if om, ok := o[i].(map[string]any); ok {
								v[i] = keepEmptyMaps(vm, om)
							}
						}
					}
				}
			}
		}
	}
	return changed
}
