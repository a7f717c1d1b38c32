# dtensor_dependencies(): the offline Bazel rules and the system libraries //:dtensor builds
# against, for another Bazel workspace that uses this repository (NOTE [public library] in
# //:BUILD):
#
#   local_repository(name = "dtensor", path = "/path/to/this/repository")
#   load("@dtensor//:deps.bzl", "dtensor_dependencies")
#   dtensor_dependencies()
#   # BUILD: cc_binary(..., deps = ["@dtensor//:dtensor"]); .bazelrc: build --cxxopt=-std=c++17
#
# @torch comes from $DTENSOR_PYTHON's torch (third_party/python_torch.bzl); the others are each a
# Debian package under /usr (or CUDA under /usr/local/cuda) with its BUILD file from
# this repository's third_party/; Label() names that file inside whichever repository loaded this
# macro (@dtensor for a consumer). A repository the workspace already declares is left alone.
# The same declarations as this repository's own WORKSPACE (NOTE [offline build]); the test that
# they are enough is tests/consumers/external_workspace_test.sh.

load("//third_party:python_torch.bzl", "python_torch")

_SYSTEM_LIBRARIES = {
    # name: (path, BUILD file in third_party/)
    "absl": ("/usr", "absl.BUILD"),
    "nlohmann_json": ("/usr", "nlohmann_json.BUILD"),
    # Used only under --define=with_cuda=true (//collectives:nccl_backend).
    "cuda": ("/usr/local/cuda", "cuda.BUILD"),
}

# Offline stand-ins for what Bazel's default WORKSPACE suffix would download (NOTE [offline
# build]): Debian's packaged rules, and this repository's own small ones.
_DEBIAN_RULES = {
    "platforms": "/usr/share/bazel/tools/platforms",
    "rules_java": "/usr/share/bazel/rules/java",
}
_OWN_RULES = {
    "rules_cc": "//third_party/rules_cc:WORKSPACE",
    "remote_coverage_tools": "//third_party/remote_coverage_tools:WORKSPACE",
}

def _directory_of_impl(ctx):
    # A local repository whose path is the directory of a file of this repository (a path
    # relative to this repository would be read relative to the consumer's workspace).
    directory = ctx.path(ctx.attr.marker).dirname
    for entry in directory.readdir():
        ctx.symlink(entry, entry.basename)

_directory_of = repository_rule(
    implementation = _directory_of_impl,
    attrs = {"marker": attr.label(allow_single_file = True)},
    local = True,
)

def dtensor_dependencies():
    # @torch from $DTENSOR_PYTHON's torch (NOTE [torch from Python]).
    if native.existing_rule("torch") == None:
        python_torch(name = "torch")
    for name, path in _DEBIAN_RULES.items():
        if native.existing_rule(name) == None:
            native.local_repository(name = name, path = path)
    for name, marker in _OWN_RULES.items():
        if native.existing_rule(name) == None:
            _directory_of(name = name, marker = Label(marker))
    for name, (path, build_file) in _SYSTEM_LIBRARIES.items():
        if native.existing_rule(name) == None:
            native.new_local_repository(
                name = name,
                build_file = str(Label("//third_party:" + build_file)),
                path = path,
            )
