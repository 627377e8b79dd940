// src/tool/main.cpp: the `ccfuse` executable. All behaviour lives in run_tool (testable, never
// exits); main only hands it the process's streams and returns its code.
#include <iostream>

#include "src/tool/cli.h"

int main(int argc, char** argv) { return ccfuse::tool::run_tool(argc, argv, std::cout, std::cerr); }
