"""Offline task data: generators of the committed training/held-out files, and loaders of fixed benchmarks.

A leaf of grpo_recipes: nothing here imports the rest of the package.
- code_tasks.py: procedural Python functions with unit tests (recipes/data/code_train.jsonl)
- json_tasks.py: structured extraction, text -> schema-valid JSON (recipes/data/json_{train,eval}.jsonl)
- humaneval.py: HumanEval, the code recipe's held-out set (never trained on)
"""
