# whole_shared_library: one shared library holding every object of its C++ dependencies,
# transitively (//:libdtensor.so, installed by ./x install; NOTE [public library] in //:BUILD).
#
# A cc_binary(linkshared = 1) links its dependencies lazily (--start-lib / archives): only objects
# that its own sources reference end up in it, and a library target with no sources of its own
# would hold only the alwayslink libraries (the backend registrations). This rule relinks every
# static library of the dependencies' CcInfo as alwayslink (-Wl,-whole-archive), keeping their
# link flags (-ltorch, -labsl_..., -lz), so the whole public API is exported. Output group
# `link_flags`: <name>.link_flags, those flags one a line (./x install writes them into dtensor.pc).

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _whole_shared_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    libraries = []
    flags = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            flags.extend(linker_input.user_link_flags)
            for lib in linker_input.libraries:
                if lib.pic_static_library == None and lib.static_library == None:
                    continue
                libraries.append(cc_common.create_library_to_link(
                    actions = ctx.actions,
                    feature_configuration = feature_configuration,
                    cc_toolchain = cc_toolchain,
                    static_library = lib.static_library,
                    pic_static_library = lib.pic_static_library,
                    alwayslink = True,
                ))

    # Each flag once, in its first position (every library repeats -ltorch and friends).
    seen = {}
    unique_flags = []
    for flag in flags:
        if flag not in seen:
            seen[flag] = True
            unique_flags.append(flag)
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset([cc_common.create_linker_input(
            owner = ctx.label,
            libraries = depset(libraries),
            user_link_flags = depset(unique_flags),
        )]),
    )
    output = cc_common.link(
        actions = ctx.actions,
        name = ctx.attr.library_name,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        linking_contexts = [linking_context],
        output_type = "dynamic_library",
    )
    library = output.library_to_link.resolved_symlink_dynamic_library or \
              output.library_to_link.dynamic_library

    # The system libraries' flags, one a line, for the pkg-config file of ./x install.
    flags_file = ctx.actions.declare_file(ctx.label.name + ".link_flags")
    ctx.actions.write(flags_file, "".join([flag + "\n" for flag in unique_flags]))
    return [
        DefaultInfo(files = depset([library])),
        OutputGroupInfo(link_flags = depset([flags_file])),
    ]

whole_shared_library = rule(
    implementation = _whole_shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        # The output is lib<library_name>.so.
        "library_name": attr.string(mandatory = True),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
